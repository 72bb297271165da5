"""The Python rules: one pass over the candidate module's AST, names resolved through import aliases (so
``nn.Linear`` after ``import torch.nn as nn`` is caught where KernelBench's regexes miss it)."""
from __future__ import annotations

import ast

from kevin_exp.bench.ast_names import (
    SCOPES,
    bound_names,
    is_const_getattr,
    qualname,
    walk_scope,
)
from kevin_exp.bench.checks.python_kinds import MATH_BUILTINS, TensorKinds
from kevin_exp.bench.checks.python_module import CandidateModule
from kevin_exp.bench.checks.python_names import ALLOWED_IMPORTS, classify_chain
from kevin_exp.bench.checks.python_reach import InterpreterReach
from kevin_exp.bench.checks.rules import (
    KERNEL_RULE,
    SYNC_RULE,
    TENSOR_COMPUTE_METHODS,
    Violation,
    rule_enabled,
    words,
)
from kevin_exp.bench.config import CheckRules

_CONCURRENCY_METHODS = words("wait_stream record_stream")
_UNSAFE_BUILTINS = words("exec eval compile open globals locals vars breakpoint input help __import__")
_DUNDER_OK = words("__init__ __name__ __doc__ __file__")
_DEF_DUNDER_OK = words("__init__ __repr__ __str__")
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.MatMult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift,
          ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor)
_PATCH_RULE = "timing, synchronisation and torch functions must not be modified"
_MAX_REPORTED = 50  # violations per candidate (the verdict shows the first five)


class PythonChecker(CandidateModule, InterpreterReach):
    """The Python rules over one candidate module; ``run`` returns its violations (one per rule, line and
    message)."""

    def __init__(self, tree: ast.Module, rules: CheckRules) -> None:
        super().__init__(tree)
        self.rules = rules
        self.out: dict[tuple[str, int | None, str], Violation] = {}
        self._scope_names: dict[int, set[str]] = {}
        self._reach_init()

    def add(self, rule: str, node: ast.AST | None, text: str) -> None:
        if rule_enabled(rule, self.rules) and len(self.out) < _MAX_REPORTED:
            line = getattr(node, "lineno", None)
            msg = f"line {line}: {text}" if line else text
            self.out.setdefault((rule, line, msg), Violation(rule, msg, line))

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
            self.check_reach(node)
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
            if isinstance(scope, (*SCOPES, ast.Module)):
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
        if qualname(receiver, self.aliases) or self.is_ext_receiver(receiver) or (
                isinstance(receiver, ast.Name) and receiver.id == "self"):
            return
        if isinstance(receiver, ast.Call) and qualname(receiver.func, self.aliases) in ("torch.finfo", "torch.iinfo"):
            return
        if attr in _CONCURRENCY_METHODS:
            self.add("concurrency", node, f".{attr}() works across CUDA streams; {SYNC_RULE}")
        else:
            self.add("torch_compute", node, f"`.{attr}()` is a PyTorch tensor compute method; {KERNEL_RULE}")

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
    # ---------------------------------------------------------------- operators in forward
    def _check_operators(self, forward: ast.FunctionDef | ast.AsyncFunctionDef, is_forward: bool) -> None:
        kinds = TensorKinds(self, forward, is_forward)
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
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in MATH_BUILTINS:
                operands = list(node.args)
            if any(o is node or kinds.of(o) == "T" for o in operands):
                self.add("torch_compute", node, f"`{_src(node)}` computes on tensors with a Python operator or "
                         f"builtin (PyTorch does the math); {KERNEL_RULE}")


def _src(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def check_python(tree: ast.Module, backend: str, rules: CheckRules) -> list[Violation]:
    """AST rules on the candidate module (``backend`` is accepted for symmetry; the rules are shared)."""
    return sorted(PythonChecker(tree, rules).run(), key=lambda v: v.line or 0)
