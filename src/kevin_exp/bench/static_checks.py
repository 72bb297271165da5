"""Static hack defences on a candidate (Kevin App. F; kevin-recipe.md 1.6, 2.6, 5).

Python is checked on its AST (names resolved through import aliases, so ``nn.Linear`` after
``import torch.nn as nn`` is caught where KernelBench's regexes miss it); C++/CUDA sources are checked
after comments and string literals are stripped. Every rule has a switch in ``CheckRules``; the
allow-lists and their rationale are in docs/hack_defences.md.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from kevin_exp.bench.candidate_source import (
    _SCOPES, bound_names, extract_calls, import_aliases, is_const_getattr, is_load_inline, load_inline_names,
    parent_map, qualname, walk_scope,
)
from kevin_exp.bench.build import user_flags
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import CandidateSource, ExtensionSpec

__all__ = ["Violation", "check_python", "check_native", "check_candidate"]


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    line: int | None = None


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Allowed torch attributes (everything else under torch.* is torch_compute): allocation, dtypes and
# devices, annotations, grad mode, device queries, and the load_inline entry point.
TORCH_ALLOWED = frozenset(f"torch.{n}" for n in _words("""
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like tensor as_tensor arange
    randn rand randint randn_like rand_like
    float32 float float16 half bfloat16 float64 double int64 long int32 int int16 short int8 uint8 bool
    complex64 cfloat complex128 cdouble dtype device Size Tensor strided contiguous_format channels_last
    preserve_format no_grad inference_mode is_tensor is_floating_point numel get_default_dtype finfo iinfo
    cuda.is_available cuda.current_device cuda.device_count cuda.get_device_properties cuda.device
    cuda.get_device_capability cuda.get_device_name cuda.current_stream cuda.synchronize
    utils.cpp_extension utils.cpp_extension.load_inline autograd.Function"""))
# Tensor methods that allocate, convert, reshape or read metadata (documentation + torch.Tensor.X).
TENSOR_METHODS_ALLOWED = _words("""
    view view_as reshape reshape_as contiguous size dim ndimension numel nelement shape stride is_contiguous
    data_ptr storage_offset element_size to cuda cpu float half double bfloat16 int long bool type_as unsqueeze
    squeeze permute transpose t flatten unflatten expand expand_as narrow detach clone copy_ fill_ zero_
    new_empty new_zeros new_ones new_full new_tensor item dtype device is_cuda requires_grad_ tolist
    uniform_ normal_ chunk unbind""")
# Tensor methods that compute: flagged when called on anything but a module or the extension object.
TENSOR_COMPUTE_METHODS = _words("""
    matmul mm bmm mv dot vdot addmm addmv addbmm baddbmm addr outer ger inner kron tensordot
    sum mean max min amax amin argmax argmin prod std var norm median mode nansum nanmean logsumexp cumsum
    cumprod cummax cummin add add_ sub sub_ subtract mul mul_ multiply div div_ divide true_divide
    floor_divide remainder fmod pow pow_ neg neg_ negative abs abs_ absolute sign sgn reciprocal rsqrt sqrt
    sqrt_ square exp exp_ exp2 expm1 log log_ log2 log10 log1p sin cos tan sinh cosh tanh tanh_ asin acos
    atan atan2 erf erfc erfinv floor ceil round trunc frac clamp clamp_ clip clip_ clamp_min clamp_max lerp
    addcmul addcdiv maximum minimum fmax fmin hypot relu relu_ sigmoid sigmoid_ softmax log_softmax gelu
    silu mish hardtanh hardswish leaky_relu elu selu softplus logit threshold lt gt le ge eq ne logical_and
    logical_or logical_not logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not where masked_fill
    masked_fill_ masked_scatter masked_select gather scatter scatter_ scatter_add scatter_add_
    scatter_reduce index_select index_add index_add_ index_copy index_copy_ index_fill index_fill_
    index_put index_put_ take take_along_dim put_ topk kthvalue argsort msort cross triu tril trace flip
    fliplr flipud roll repeat repeat_interleave tile any all nonzero count_nonzero unique bincount histc
    apply_ map_ map2_ numpy conv1d conv2d conv3d linear softmax_ dropout layer_norm batch_norm""")
NN_ALLOWED = _words("Module Parameter ParameterList ParameterDict ModuleList ModuleDict init parameter")
ALLOWED_IMPORTS = _words("""torch torch.nn torch.nn.functional torch.nn.init torch.utils
    torch.utils.cpp_extension torch.cuda math typing numbers __future__""")
_TORCH_PRIVATE_OK = _words("torch.nn.init._calculate_fan_in_and_fan_out torch.nn.init._calculate_correct_fan")
_CONCURRENCY = _words("""threading _thread multiprocessing concurrent asyncio subprocess signal sched
    os.fork os.forkpty os.system os.popen os.posix_spawn os.posix_spawnp torch.multiprocessing torch.cuda.Stream
    torch.cuda.stream torch.cuda.ExternalStream torch.cuda.StreamContext torch.cuda.set_stream torch.cuda.graph
    torch.cuda.graphs torch.cuda.CUDAGraph torch.cuda.make_graphed_callables torch.Stream torch.jit.fork
    torch.futures torch.distributed""")
_CONCURRENCY_METHODS = _words("wait_stream record_stream")
_DANGEROUS_MODULES = _words("""os sys subprocess ctypes builtins importlib inspect gc types pickle marshal
    shutil socket io pathlib tempfile weakref platform code codeop runpy pty mmap resource atexit""")
_UNSAFE_BUILTINS = _words("exec eval compile open globals locals vars breakpoint input __import__")
_DUNDER_OK = _words("__init__ __name__ __doc__ __file__")
_DEF_DUNDER_OK = _words("__init__ __repr__ __str__")
_SHAPE_METHODS = _words("""size dim ndimension numel nelement stride element_size storage_offset
    is_contiguous data_ptr item get_device is_floating_point""")
_SHAPE_ATTRS = _words("shape ndim dtype device is_cuda is_cpu layout requires_grad itemsize nbytes")
_SCALAR_BUILTINS = _words("len int float bool range")
_MATH_BUILTINS = _words("abs sum max min pow round divmod")
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.MatMult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift,
          ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor)
_KERNEL_RULE = "all computation must happen in your kernel"
_SYNC_RULE = "all work must run synchronously on the current stream"
_PATCH_RULE = "timing, synchronisation and torch functions must not be modified"


def classify_chain(q: str) -> tuple[str, str] | None:
    """(rule, message) for a resolved dotted name, or None when it is allowed."""
    parts = q.split(".")
    if any(p.startswith("__") and p.endswith("__") for p in parts):
        return None  # dunder attribute access is reported on its own
    if any(p in _DANGEROUS_MODULES for p in parts[1:]) or (
            parts[0] == "torch" and any(p.startswith("_") for p in parts[1:]) and q not in _TORCH_PRIVATE_OK):
        return "unsafe_builtin", (f"{q} reaches interpreter or torch internals; only public torch, math and "
                                  "typing APIs may be used")
    if any(q == c or q.startswith(c + ".") for c in _CONCURRENCY) or (
            parts[0] == "os" and len(parts) > 1 and parts[1].startswith(("spawn", "exec"))):
        return "concurrency", f"{q} creates threads, processes or streams; {_SYNC_RULE}"
    if parts[:2] == ["torch", "nn"]:
        if len(parts) > 2 and parts[2] in NN_ALLOWED:
            return None
        return "torch_nn", (f"{q} is a torch.nn layer or function; {_KERNEL_RULE} "
                            "(only nn.Module, nn.Parameter, containers and nn.init are allowed)")
    if parts[0] != "torch" or q in TORCH_ALLOWED:
        return None
    if parts[:2] == ["torch", "Tensor"] and len(parts) == 3 and parts[2] in TENSOR_METHODS_ALLOWED:
        return None
    if q.startswith("torch.utils.cpp_extension.") and len(parts) == 4:
        return None
    return "torch_compute", f"{q} is a PyTorch compute op (or not on the allow-list); {_KERNEL_RULE}"


_SWITCH = {
    "torch_nn": "no_torch_nn", "torch_compute": "no_torch_compute", "try_except": "no_try_except",
    "pass": "no_pass", "reference_subclass": "no_reference_subclass", "no_kernel": "require_kernel",
    "concurrency": "no_concurrency", "timing_patch": "no_timing_patch", "import": "restrict_imports",
    "unsafe_builtin": "restrict_imports", "native_library_compute": "no_native_library_compute",
}


def rule_enabled(rule: str, rules: CheckRules) -> bool:
    return bool(getattr(rules, _SWITCH[rule]))


class _PythonChecker:
    def __init__(self, tree: ast.Module, rules: CheckRules) -> None:
        self.tree, self.rules = tree, rules
        self.nodes = list(ast.walk(tree))
        self.parents = parent_map(tree)
        self.aliases = import_aliases(tree)
        trusted = load_inline_names(tree, dict(self.aliases))
        self._propagate_aliases()
        self.li_calls = {n for n in self.nodes if is_load_inline(n, trusted)}
        models = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
        self.model = models[-1] if models else None
        self.methods = {f.name: f for f in (self.model.body if self.model else [])
                        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.ext_names, self.ext_attrs = self._extension_refs()
        self.out: dict[tuple[str, int | None, str], Violation] = {}
        self._scope_names: dict[int, set[str]] = {}

    def add(self, rule: str, node: ast.AST | None, text: str) -> None:
        if rule_enabled(rule, self.rules):
            line = getattr(node, "lineno", None)
            msg = f"line {line}: {text}" if line else text
            self.out.setdefault((rule, line, msg), Violation(rule, msg, line))

    def _propagate_aliases(self) -> None:
        assigns = [n for n in self.nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name)]
        for _ in range(3):  # `mm = torch.matmul` / `F2 = F`: later uses resolve through the alias
            changed = False
            for node in assigns:
                q = qualname(node.value, self.aliases)
                if q and node.targets[0].id not in self.aliases:  # type: ignore[attr-defined]
                    self.aliases[node.targets[0].id] = q  # type: ignore[attr-defined]
                    changed = True
            if not changed:
                break

    # ---------------------------------------------------------------- extension objects
    def _extension_refs(self) -> tuple[set[str], set[str]]:
        builders = set()
        for call in self.li_calls:  # functions that contain a load_inline call
            node: ast.AST | None = call
            while node is not None:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    builders.add(node.name)
                node = self.parents.get(node)
        names: set[str] = set()
        attrs: set[str] = set()

        def is_ext(e: ast.AST) -> bool:
            # the extension object itself or one of its attributes, never the result of calling it
            if e in self.li_calls:
                return True
            if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in builders:
                return True
            if isinstance(e, ast.Name):
                return e.id in names
            if isinstance(e, ast.Attribute):
                return self._self_attr(e, attrs) or is_ext(e.value)
            if isinstance(e, ast.IfExp):
                return is_ext(e.body) or is_ext(e.orelse)
            return isinstance(e, ast.BoolOp) and any(is_ext(v) for v in e.values)

        bindings = [n for n in self.nodes if isinstance(n, (ast.Assign, ast.AnnAssign, ast.NamedExpr))
                    and n.value is not None]
        for _ in range(3):
            for node in bindings:
                if not is_ext(node.value):  # type: ignore[attr-defined]
                    continue
                for t in getattr(node, "targets", None) or [node.target]:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                        if self.model is not None and self.parents.get(node) is self.model:
                            attrs.add(t.id)  # class attribute: used as self.<name>
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        attrs.add(t.attr)
        return names, attrs

    @staticmethod
    def _self_attr(node: ast.AST, attrs: set[str]) -> bool:
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr in attrs)

    def _is_ext_receiver(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in self.ext_names) or self._self_attr(node, self.ext_attrs)

    # ---------------------------------------------------------------- rules
    def run(self) -> list[Violation]:
        for node in self.nodes:
            if isinstance(node, (ast.Try, ast.TryStar)):
                self.add("try_except", node, "try/except is not allowed (a fallback around the kernel hides "
                         "its failures); let errors propagate")
            elif isinstance(node, ast.Pass):
                self.add("pass", node, "`pass` is not allowed (empty bodies were used to inherit the reference "
                         "model); every block must do real work")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self._check_import(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("__") \
                    and node.name.endswith("__") and node.name not in _DEF_DUNDER_OK:
                self.add("unsafe_builtin", node, f"defining special method {node.name} is not allowed "
                         "(it can intercept torch or comparison machinery)")
            elif isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if qualname(base, self.aliases) == "torch.Tensor":
                        self.add("unsafe_builtin", node, f"class {node.name} subclasses torch.Tensor; tensor "
                                 "subclasses (lazy evaluation) are not allowed, return plain tensors")
            self._check_names(node)
            self._check_patch(node)
            if isinstance(node, ast.Call):
                self._check_call(node)
            self._check_member(node)
        self._check_model()
        forward = self.methods.get("forward")
        if forward is not None:
            for fn in self._reachable(forward):
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name != "__init__":
                    self._check_operators(fn, is_forward=fn is forward)
        return list(self.out.values())

    def _check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            modules = [node.module or ""] if not node.level else ["." * node.level + (node.module or "")]
        for mod in modules:
            found = classify_chain(mod)
            if found and found[0] == "concurrency":
                self.add("concurrency", node, f"importing {mod}: {found[1]}")
            elif mod not in ALLOWED_IMPORTS:
                self.add("import", node, f"importing {mod} is not allowed; only "
                         f"{', '.join(sorted(ALLOWED_IMPORTS))} may be imported")
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in ALLOWED_IMPORTS:
            for a in node.names:
                q = f"{node.module}.{a.name}"
                if a.name == "*":
                    self.add("import", node, f"`from {node.module} import *` is not allowed; import names explicitly")
                elif q not in ALLOWED_IMPORTS and (found := classify_chain(q)):
                    self.add(found[0], node, f"importing {found[1]}")

    def _consumed(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return (isinstance(parent, ast.Attribute) and parent.value is node) or (
            is_const_getattr(parent) and parent.args[0] is node)  # type: ignore[union-attr]

    def _check_names(self, node: ast.AST) -> None:
        attr = node.attr if isinstance(node, ast.Attribute) else ""
        if is_const_getattr(node):
            attr = node.args[1].value  # type: ignore[attr-defined]
        if attr.startswith("__") and attr.endswith("__") and attr not in _DUNDER_OK:
            self.add("unsafe_builtin", node, f"`{_src(node)}` accesses a special attribute; dunder access is not "
                     "allowed")
        if isinstance(node, ast.Attribute) and node.attr == "_make_subclass":
            self.add("unsafe_builtin", node, "_make_subclass builds tensor subclasses (lazy evaluation); not allowed")
        if isinstance(node, ast.Name):
            if node.id.startswith("__") and node.id.endswith("__") and node.id not in _DUNDER_OK:
                self.add("unsafe_builtin", node, f"{node.id} is not allowed (interpreter internals)")
            elif node.id in _UNSAFE_BUILTINS and isinstance(node.ctx, ast.Load) and self._is_builtin_ref(node):
                self.add("unsafe_builtin", node, f"the builtin {node.id} is not allowed (dynamic code, files or "
                         "scopes)")
        if not (isinstance(node, (ast.Name, ast.Attribute)) or is_const_getattr(node)) or self._consumed(node):
            return
        if isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
            return  # assignment targets: timing_patch
        q = qualname(node, self.aliases)
        found = classify_chain(q) if q else None
        if found:
            self.add(found[0], node, found[1])

    def _is_builtin_ref(self, node: ast.Name) -> bool:
        """Whether a name resolves to the builtin (`def forward(self, input)` shadows `input`)."""
        scope: ast.AST | None = node
        while scope is not None:
            scope = self.parents.get(scope)
            if isinstance(scope, (*_SCOPES, ast.Module)):
                if id(scope) not in self._scope_names:
                    self._scope_names[id(scope)] = {n for x in walk_scope(scope) for n in bound_names(x)}
                if node.id in self._scope_names[id(scope)]:
                    return False
        return True

    def _check_patch(self, node: ast.AST) -> None:
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            targets = [node.optional_vars]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args:
            q = qualname(node.args[0], self.aliases)
            if q:
                self.add("timing_patch", node, f"{node.func.id} on {q} monkey-patches an imported module; "
                         f"{_PATCH_RULE}")
        for t in targets:
            for leaf in ast.walk(t):
                if isinstance(leaf, (ast.Attribute, ast.Subscript)) and isinstance(leaf.ctx, (ast.Store, ast.Del)):
                    base = leaf
                    while isinstance(base, (ast.Attribute, ast.Subscript)):
                        q = qualname(base, self.aliases)
                        if q:
                            self.add("timing_patch", node, f"assigning to {q} monkey-patches an imported module; "
                                     f"{_PATCH_RULE}")
                            break
                        base = base.value

    def _check_call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Name) and f.id in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2 \
                and not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            self.add("unsafe_builtin", node, f"{f.id} with a computed attribute name is not allowed; use plain "
                     "attribute access")

    def _check_member(self, node: ast.AST) -> None:
        """`<tensor>.matmul`, `getattr(t, "relu")`: compute methods on anything that is not a module
        alias, the extension object, ``self`` or a torch.finfo/iinfo result."""
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            receiver, attr = node.value, node.attr
        elif is_const_getattr(node):
            receiver, attr = node.args[0], node.args[1].value  # type: ignore[attr-defined]
        else:
            return
        if attr not in TENSOR_COMPUTE_METHODS and attr not in _CONCURRENCY_METHODS:
            return
        if qualname(receiver, self.aliases) or self._is_ext_receiver(receiver) or (
                isinstance(receiver, ast.Name) and receiver.id == "self"):
            return
        if isinstance(receiver, ast.Call) and qualname(receiver.func, self.aliases) in ("torch.finfo", "torch.iinfo"):
            return
        if attr in _CONCURRENCY_METHODS:
            self.add("concurrency", node, f".{attr}() works across CUDA streams; {_SYNC_RULE}")
        else:
            self.add("torch_compute", node, f"`.{attr}()` is a PyTorch tensor compute method; {_KERNEL_RULE}")

    def _check_model(self) -> None:
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew"
                                                    for t in node.targets):
                self.add("reference_subclass", node, "ModelNew must be a class defined with "
                         "`class ModelNew(nn.Module)`, not an alias of another model")
        if not self.li_calls:
            self.add("no_kernel", None, "no call to torch.utils.cpp_extension.load_inline: the kernel must be "
                     "written inline and built with load_inline")
        if self.model is None:
            self.add("no_kernel", None, "no class ModelNew is defined")
            return
        bad = [b for b in self.model.bases if qualname(b, self.aliases) != "torch.nn.Module"] + self.model.keywords
        if bad or not self.model.bases:
            what = ", ".join(_src(b) for b in bad) or "nothing"
            self.add("reference_subclass", self.model, f"ModelNew inherits {what}; it must subclass nn.Module only "
                     "(inheriting the reference model is not allowed)")
        forward = self.methods.get("forward")
        if forward is None:
            self.add("no_kernel", self.model, "ModelNew defines no forward method")
        elif self.li_calls and not self._forward_uses_extension(forward):
            self.add("no_kernel", forward, "ModelNew.forward never calls the extension built with load_inline; "
                     "the kernel must do the work")

    def _reachable(self, forward: ast.AST) -> list[ast.AST]:
        """forward, the ModelNew methods it uses and the module-level functions/classes it names."""
        module_defs = {n.name: n for n in self.tree.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        todo, seen = [forward], {}
        while todo:
            fn = todo.pop()
            if id(fn) in seen:
                continue
            seen[id(fn)] = fn
            for n in ast.walk(fn):
                if isinstance(n, ast.Name) and n.id in module_defs:
                    todo.append(module_defs[n.id])
                elif self._self_attr(n, set(self.methods)):
                    todo.append(self.methods[n.attr])  # type: ignore[attr-defined]
        for cls in [f for f in seen.values() if isinstance(f, ast.ClassDef)]:
            seen.update({id(m): m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))})
        return list(seen.values())

    def _forward_uses_extension(self, forward: ast.AST) -> bool:
        return any(n in self.li_calls or self._is_ext_receiver(n)
                   for fn in self._reachable(forward) for n in ast.walk(fn))

    # ---------------------------------------------------------------- operators in forward
    def _check_operators(self, forward: ast.FunctionDef | ast.AsyncFunctionDef, is_forward: bool) -> None:
        kinds = _Kinds(self, forward, is_forward)
        for node in ast.walk(forward):
            operands: list[ast.AST] = []
            if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH):
                operands = [node.left, node.right]
                if isinstance(node.op, ast.MatMult) and not all(kinds.of(o) == "S" for o in operands):
                    operands = [node]  # `@` is never shape arithmetic
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, _ARITH):
                operands = [node.target, node.value]
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Invert)):
                operands = [node.operand]
            elif isinstance(node, ast.Compare) and not any(isinstance(o, (ast.Is, ast.IsNot, ast.In, ast.NotIn))
                                                           for o in node.ops):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _MATH_BUILTINS:
                operands = list(node.args)
            if any(o is node or kinds.of(o) == "T" for o in operands):
                self.add("torch_compute", node, f"`{_src(node)}` computes on tensors with a Python operator or "
                         f"builtin (PyTorch does the math); {_KERNEL_RULE}")


class _Kinds:
    """Flow-insensitive guess of what a forward expression is: T tensor, S shape/scalar, U unknown."""

    def __init__(self, checker: _PythonChecker, forward: ast.FunctionDef | ast.AsyncFunctionDef,
                 is_forward: bool) -> None:
        self.c = checker
        self.names: dict[str, str] = {}
        self.module_scalars = {t.id for n in checker.tree.body if isinstance(n, ast.Assign)
                               and isinstance(n.value, ast.Constant) and isinstance(n.value.value, (int, float))
                               for t in n.targets if isinstance(t, ast.Name)}
        self.self_attrs = self._self_attr_kinds()
        args = forward.args
        defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults)) if args.defaults else {}
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        for a in params[1:] if params and params[0].arg in ("self", "ctx") else params:
            scalar = a.arg in defaults or (a.annotation is not None and _src(a.annotation) in ("int", "float", "bool"))
            # forward's arguments are the problem's input tensors; a helper's could be anything
            self.names[a.arg] = "S" if scalar else "T" if is_forward else "U"
        for _ in range(3):
            for n in ast.walk(forward):
                if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                    for t in getattr(n, "targets", None) or [n.target]:
                        self._bind(t, self.of(n.value))
                elif isinstance(n, (ast.For, ast.comprehension)):
                    it = n.iter
                    range_call = isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                    self._bind(n.target, "S" if range_call else self.of(it))

    def _bind(self, target: ast.AST, kind: str) -> None:
        if isinstance(target, ast.Name):
            old = self.names.get(target.id)
            self.names[target.id] = "T" if "T" in (old, kind) else ("S" if old in (None, "S") and kind == "S" else "U")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for e in target.elts:
                self._bind(e, kind)

    def _self_attr_kinds(self) -> dict[str, str]:
        out: dict[str, str] = {}
        init = self.c.methods.get("__init__")
        params = {a.arg for a in init.args.args} if init else set()
        for node in ast.walk(self.c.model) if self.c.model else []:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "register_buffer" and node.args and isinstance(node.args[0], ast.Constant):
                out[str(node.args[0].value)] = "T"
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    v = node.value
                    q = qualname(v.func, self.c.aliases) if isinstance(v, ast.Call) else None
                    tensor = bool(q and q.startswith("torch.")) or (isinstance(v, ast.Call) and isinstance(
                        v.func, ast.Attribute) and v.func.attr not in _SHAPE_METHODS)
                    scalar = isinstance(v, ast.Constant) or (isinstance(v, ast.Name) and v.id in params)
                    out[t.attr] = "T" if tensor else "S" if scalar else out.get(t.attr, "U")
        return out

    def of(self, e: ast.AST) -> str:
        if isinstance(e, ast.Constant):
            return "S"
        if isinstance(e, ast.Name):
            return self.names.get(e.id) or ("S" if e.id in self.module_scalars else "U")
        if isinstance(e, ast.Attribute):
            if e.attr in _SHAPE_ATTRS:
                return "S"
            if isinstance(e.value, ast.Name) and e.value.id == "self":
                return self.self_attrs.get(e.attr, "U")
            return "U"
        if isinstance(e, ast.Subscript):
            return self.of(e.value)
        if isinstance(e, (ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Tuple, ast.List)):
            kids = [self.of(k) for k in ast.iter_child_nodes(e) if isinstance(k, ast.expr)]
            return "T" if "T" in kids else "S" if all(k == "S" for k in kids) else "U"
        if isinstance(e, ast.Call):
            f = e.func
            if isinstance(f, ast.Name) and f.id in _SCALAR_BUILTINS:
                return "S"
            if isinstance(f, ast.Name) and f.id in _MATH_BUILTINS:
                return self.of(ast.Tuple(elts=list(e.args)))
            q = qualname(f, self.c.aliases)
            if q and q.startswith("math."):
                return "S"
            if q and q.startswith("torch.") or isinstance(f, ast.Attribute) and self.c._is_ext_receiver(f.value):
                return "T"
            if isinstance(f, ast.Attribute):
                if f.attr in _SHAPE_METHODS:
                    return "S"
                return "T" if self.of(f.value) == "T" else "U"
        return "U"


# --------------------------------------------------------------------------- native sources

# Unterminated comments/literals run to the end (of the text or line) so that no input makes the
# scan quadratic; the compiler rejects such code anyway.
_COMMENT_OR_LITERAL = re.compile(
    r'//[^\n]*|/\*.*?(?:\*/|\Z)|R"(?P<d>[^()\\\s]{0,16})\(.*?(?:\)(?P=d)"|\Z)|"(?:\\.|[^"\\\n])*"?|'
    r"'(?:\\.|[^'\\\n])*'?", re.S)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_ROOTS = ("at", "aten", "torch", "c10", "caffe2")
_NS_ALIAS = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+((?:::)?\w+(?:\s*::\s*\w+)*)[ \t]*$|"
                       r"\bnamespace\s+(\w+)\s*=\s*((?:::)?\w+(?:\s*::\s*\w+)*)\s*;", re.M)
_USING_NS = re.compile(r"\busing\s+namespace\s+(?:::)?(at|aten|torch)\b")
_METHOD_CALL = re.compile(r"(?:\.|->)\s*(\w+)\s*(?:<[^;(){}]*>)?\s*\(")
_KERNEL = re.compile(r"\b__global__\b")
_LAUNCH = re.compile(r"<<<|\bcu(?:da)?Launch(?:Cooperative)?Kernel(?:Ex)?\b")
_VENDOR = re.compile(r"\b(?:(?i:cublas|cudnn|cusparse|cusolver|cufft)\w*|cblas_\w+|mkl_\w+|MKL_\w+|dnnl\w*|"
                     r"mkldnn\w*|openblas\w*|[sdcz]gemm_|dlopen|dlsym)\b|\b(?:cutlass|cute|thrust|Eigen)\s*::|"
                     r"\bcub\s*::\s*Device\w*")
_VENDOR_INCLUDE = re.compile(r"(?i)^(?:cublas|cudnn|cusparse|cusolver|cufft|cutlass/|cute/|cblas|mkl|dnnl|mkldnn|"
                             r"oneapi/dnnl|eigen|openblas|ATen/cuda/CUDABlas|ATen/cudnn/|cub/device/)")
_VENDOR_FLAG = re.compile(r"(?i)cublas|cudnn|cusparse|cusolver|cufft|mkl|openblas|blas|dnnl|lapack|cutlass|eigen")
_DISPATCH = re.compile(r"\b(?:DispatchKey\w*|\w*DispatchKeyGuard|AutoDispatch\w+|\w*LocalDispatchKeySet|Dispatcher|"
                       r"OperatorHandle|redispatch|TORCH_LIBRARY\w*|PythonTLSSnapshot|ThreadLocalStateGuard)\b")
_NATIVE_CONCURRENCY = re.compile(
    r"\b(?:cudaStreamCreate\w*|cuStreamCreate\w*|pthread_create|getStreamFromPool|getStreamFromExternal|"
    r"setCurrentCUDAStream|\w*CUDAStreamGuard|CUDAMultiStreamGuard|cudaLaunchHostFunc|cuLaunchHostFunc|"
    r"cudaStreamAddCallback)\b|\bstd\s*::\s*(?:thread|jthread|async)\b|(?<![\w.:>])v?fork\s*\(")
_NATIVE_UNSAFE = re.compile(  # Python C-API / pybind11 calls back into Python, processes, memory tricks
    r"\b(?:Py[A-Z][A-Za-z]*_\w+|Py_\w+|mprotect|ptrace|process_vm_writev)\b|(?:\.|->)\s*attr\s*\(|"
    r"(?<![\w.:>])(?:system|popen|exec[lv]p?e?)\s*\(|"
    r"\b(?:py|pybind11)\s*::\s*(?:module_?\s*::\s*import|exec|eval\w*|globals)\b")
NATIVE_ALLOWED = _words("""empty empty_like empty_strided zeros zeros_like ones ones_like full full_like from_blob
    Tensor TensorBase TensorOptions IntArrayRef ArrayRef OptionalIntArrayRef ScalarType Device DeviceType
    DeviceGuard OptionalDeviceGuard Layout MemoryFormat Scalar Half BFloat16 dtype device layout requires_grad
    memory_format TensorAccessor PackedTensorAccessor PackedTensorAccessor32 PackedTensorAccessor64
    GenericPackedTensorAccessor RestrictPtrTraits DefaultPtrTraits irange ceil_div optional nullopt toString
    elementSize isFloatingType isIntegralType isComplexType acc_type opmath_type numeric_limits device_of
    indexing NoGradGuard parallel_for get_num_threads get_thread_num Error""")
NATIVE_ALLOWED_PATHS = _words("""cuda::getCurrentCUDAStream cuda::getDefaultCUDAStream cuda::CUDAGuard
    cuda::OptionalCUDAGuard cuda::CUDAStream cuda::getCurrentDeviceProperties cuda::getDeviceProperties
    cuda::current_device cuda::device_count cuda::warp_size vec::Vectorized internal::GRAIN_SIZE""")
_NATIVE_METHOD_DENY = TENSOR_COMPUTE_METHODS - _words("any all numpy apply_ map_ map2_")
# Called unqualified only after `using namespace at/torch`; C math names (exp, max, ...) are excluded.
_BARE_DENY = _words("""matmul mm bmm addmm baddbmm einsum conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    conv_transpose3d linear softmax log_softmax layer_norm batch_norm group_norm instance_norm max_pool1d
    max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool2d relu gelu silu mish hardtanh
    leaky_relu elu selu softplus dropout logsumexp cumsum cumprod argmax argmin topk cat stack sum mean prod var
    std norm where masked_fill index_select gather scatter clamp sigmoid""")


def strip_native(text: str, keep_strings: bool = False) -> str:
    """Source with comments removed and (unless keep_strings) string/char literals emptied; line
    continuations are spliced first, as the preprocessor does."""
    text = text.replace("\\\r\n", "").replace("\\\n", "")

    def sub(m: re.Match[str]) -> str:
        s = m.group(0)
        if s[:2] in ("//", "/*"):
            return " " + "\n" * s.count("\n")
        return s if keep_strings else '""' + "\n" * s.count("\n")

    return _COMMENT_OR_LITERAL.sub(sub, text)


def _native_path(root: str, parts: list[str]) -> tuple[str, str] | None:
    path = "::".join(parts)
    name = f"{root}::{path}"
    if any(_NATIVE_CONCURRENCY.fullmatch(p) for p in parts):
        return None  # reported by the concurrency scan
    if any(_DISPATCH.fullmatch(p) for p in parts) or parts[0] in ("impl", "_ops"):
        return "native_library_compute", f"{name} reaches into the dispatcher (bypassing the op checks); not allowed"
    if root in ("c10", "caffe2"):
        return None
    if parts[0] in ("Tensor", "TensorBase"):
        if len(parts) > 1 and parts[1] in _NATIVE_METHOD_DENY:
            return "native_library_compute", f"{name} is an ATen compute op; {_KERNEL_RULE}"
        return None
    if parts[0] in NATIVE_ALLOWED or re.fullmatch(r"k[A-Z]\w*", parts[0]) or any(
            path == p or path.startswith(p + "::") for p in NATIVE_ALLOWED_PATHS):
        return None
    return "native_library_compute", (f"{name} is an ATen/torch library call (only allocation, tensor "
                                      f"metadata and stream/guard helpers are allowed); {_KERNEL_RULE}")


def _defines(code: str, fn: str) -> bool:
    pattern = rf"\b{re.escape(fn)}\s*\([^;{{}}]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:->[^;{{]+)?\{{"
    return re.search(pattern, code) is not None


def check_native(spec: ExtensionSpec, backend: str, rules: CheckRules) -> list[Violation]:
    """Rules on one extension's C++/CUDA sources (comments and string literals stripped first)."""
    out: list[Violation] = []
    seen: set[tuple[str, str]] = set()

    def add(rule: str, where: str | tuple[str, str, int], key: str, text: str) -> None:
        """One violation per (rule, token); the line is only worked out for reported ones."""
        if not rule_enabled(rule, rules) or (rule, key) in seen:
            return
        seen.add((rule, key))
        if isinstance(where, tuple):
            label, code, pos = where
            where = f" ({label} line {code.count(chr(10), 0, pos) + 1})"
        out.append(Violation(rule, f"extension {spec.name!r}{where}: {text}"))

    sources: list[tuple[str, str, str]] = []  # (label, code with literals, code without)
    for kind, texts in (("cpp_sources", spec.cpp_sources), ("cuda_sources", spec.cuda_sources)):
        for i, text in enumerate(texts):
            label = kind if len(texts) == 1 else f"{kind}[{i}]"
            # include lines are judged by their target, once, so they are blanked from the code scan
            sources.append((label, strip_native(text, keep_strings=True), _INCLUDE.sub("", strip_native(text))))
    everything = "\n".join(code for _, _, code in sources)
    aliases: dict[str, list[str]] = {r: [r] for r in _ROOTS}
    for m in _NS_ALIAS.finditer(everything):
        alias, target = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        parts = re.split(r"\s*::\s*", target.lstrip(":"))
        if parts[0] in _ROOTS:
            aliases[alias] = parts
    qualified = re.compile(rf"(?<![\w.])(?<!->)({'|'.join(map(re.escape, aliases))})\s*::\s*(\w+(?:\s*::\s*\w+)*)")
    bare = _USING_NS.search(everything) is not None
    defined: dict[str, bool] = {}
    for label, with_strings, code in sources:
        def where(pos: int, label: str = label, code: str = code) -> tuple[str, str, int]:
            return label, code, pos

        for m in _INCLUDE.finditer(with_strings):
            if _VENDOR_INCLUDE.match(m.group(1)):
                add("native_library_compute", f" ({label})", m.group(1), f"#include <{m.group(1)}> pulls in a vendor "
                    f"math library; {_KERNEL_RULE}")
        for m in qualified.finditer(code):
            parts = aliases[m.group(1)] + re.split(r"\s*::\s*", m.group(2))
            found = _native_path(parts[0], parts[1:]) if len(parts) > 1 else None
            if found:
                add(found[0], where(m.start()), "::".join(parts), found[1])
        for m in _METHOD_CALL.finditer(code):
            if m.group(1) in _NATIVE_METHOD_DENY:
                add("native_library_compute", where(m.start()), "." + m.group(1),
                    f".{m.group(1)}() is an ATen tensor compute method; {_KERNEL_RULE}")
        if bare:
            for m in re.finditer(r"(?<![\w.:>])(\w+)\s*(?:<[^;(){}]*>)?\s*\(", code):
                if m.group(1) in _BARE_DENY and m.group(1) not in defined:
                    defined[m.group(1)] = _defines(everything, m.group(1))
                if m.group(1) in _BARE_DENY and not defined[m.group(1)]:
                    add("native_library_compute", where(m.start()), m.group(1), f"{m.group(1)}() resolves to an "
                        f"ATen op through `using namespace`; {_KERNEL_RULE}")
        for m in _VENDOR.finditer(code):
            token = re.sub(r"\s+", "", m.group(0))
            add("native_library_compute", where(m.start()), token, f"{token} is a vendor library (cuBLAS/cuDNN/"
                f"CUTLASS/BLAS/...) or dynamic loading; {_KERNEL_RULE}")
        if "##" in code:
            add("native_library_compute", where(code.index("##")), "##", "token pasting (##) is not allowed: it "
                "hides identifiers (library and ATen calls) from these checks")
        for m in _DISPATCH.finditer(code):
            add("native_library_compute", where(m.start()), m.group(0), f"{m.group(0)} manipulates the PyTorch "
                "dispatcher (bypassing the op checks); not allowed")
        for m in _NATIVE_CONCURRENCY.finditer(code):
            token = re.sub(r"\s+", "", m.group(0)).rstrip("(")
            add("concurrency", where(m.start()), token, f"{token} creates threads, processes or streams; {_SYNC_RULE}")
        for m in _NATIVE_UNSAFE.finditer(code):
            token = re.sub(r"\s+", "", m.group(0)).rstrip("(")
            add("unsafe_builtin", where(m.start()), token, f"{token} runs Python code, processes or memory tricks "
                "from native code; not allowed")
    for flag in (*spec.extra_ldflags, *spec.extra_include_paths, *spec.extra_cflags, *spec.extra_cuda_cflags):
        if _VENDOR_FLAG.search(flag):
            add("native_library_compute", "", flag, f"build flag {flag!r} links or includes a vendor math library; "
                f"{_KERNEL_RULE}")
    _check_kernel_present(spec, backend, sources, add)
    bad_flags = user_flags.unsafe_flags(spec)
    if bad_flags:  # always on: not a reward rule but the build machine's safety
        out.append(Violation("build_flags", f"extension {spec.name!r}: {user_flags.describe(bad_flags)}"))
    return out


def _check_kernel_present(spec: ExtensionSpec, backend: str, sources: list[tuple[str, str, str]], add) -> None:
    cpp = "\n".join(code for label, _, code in sources if label.startswith("cpp"))
    cuda = "\n".join(code for label, _, code in sources if label.startswith("cuda"))
    if backend == "cuda":
        if not _KERNEL.search(cuda):
            add("no_kernel", "", "global", "defines no __global__ kernel in cuda_sources; write a CUDA kernel")
        elif not _LAUNCH.search(cuda + cpp):
            add("no_kernel", "", "launch", "never launches its kernel (no <<<...>>> or cudaLaunchKernel)")
        return
    if cuda.strip():
        add("no_kernel", "", "cuda", "cpu backend: write C++ (cpp_sources) only, cuda_sources must be empty")
    if not cpp.strip():
        add("no_kernel", "", "empty", "cpu backend: cpp_sources is empty; write the kernel in C++")
    elif spec.functions is None:
        if "PYBIND11_MODULE" not in cpp:
            add("no_kernel", "", "bind", "functions=None but no PYBIND11_MODULE block binds a C++ function")
    elif not any(_defines(cpp, fn) for fn in spec.functions):
        add("no_kernel", "", "define", f"none of the bound functions ({', '.join(spec.functions)}) is defined "
            "in cpp_sources")


def _src(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def check_python(tree: ast.Module, backend: str, rules: CheckRules) -> list[Violation]:
    """AST rules on the candidate module (``backend`` is accepted for symmetry; the rules are shared)."""
    return sorted(_PythonChecker(tree, rules).run(), key=lambda v: v.line or 0)


def check_candidate(source: str, backend: str, rules: CheckRules) -> tuple[CandidateSource, list[Violation]]:
    """Parse (SyntaxError/RecursionError/ValueError propagate), extract specs, run all static rules."""
    tree = ast.parse(source)
    calls = extract_calls(tree)
    candidate = CandidateSource(
        specs=[c.spec for c in calls if c.spec is not None],
        unresolved_calls=sum(1 for c in calls if c.spec is None),
    )
    violations = check_python(tree, backend, rules)
    seen = set(violations)
    for call in calls:
        if call.spec is None:
            continue
        for v in check_native(call.spec, backend, rules):
            v = replace(v, line=call.line, message=f"line {call.line}: {v.message}")
            if v not in seen:
                seen.add(v)
                violations.append(v)
    return candidate, sorted(violations, key=lambda v: v.line or 0)
