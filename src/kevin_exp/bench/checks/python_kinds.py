"""What the operator rule needs to know about an expression in ``ModelNew.forward`` (or a function it
reaches): whether it is a tensor, so that ``x @ w`` is flagged and ``x.size(0) * 2`` is not."""
from __future__ import annotations

import ast

from kevin_exp.bench.ast_names import qualname
from kevin_exp.bench.checks.python_module import CandidateModule
from kevin_exp.bench.checks.rules import words

_SHAPE_METHODS = words("""size dim ndimension numel nelement stride element_size storage_offset
    is_contiguous data_ptr item get_device is_floating_point""")
_SHAPE_ATTRS = words("shape ndim dtype device is_cuda is_cpu layout requires_grad itemsize nbytes")
_SCALAR_BUILTINS = words("len int float bool range")
MATH_BUILTINS = words("abs sum max min pow round divmod")


class TensorKinds:
    """Flow-insensitive guess of what a forward expression is: T tensor, S shape/scalar, U unknown."""

    def __init__(self, module: CandidateModule, forward: ast.FunctionDef | ast.AsyncFunctionDef,
                 is_forward: bool) -> None:
        self.module = module
        self.names: dict[str, str] = {}
        self.module_scalars = {t.id for n in module.tree.body if isinstance(n, ast.Assign)
                               and isinstance(n.value, ast.Constant) and isinstance(n.value.value, (int, float))
                               for t in n.targets if isinstance(t, ast.Name)}
        self.self_attrs = self._self_attr_kinds()
        args = forward.args
        defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], args.defaults)) if args.defaults else {}
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        for a in params[1:] if params and params[0].arg in ("self", "ctx") else params:
            scalar = a.arg in defaults or (
                a.annotation is not None and ast.unparse(a.annotation) in ("int", "float", "bool"))
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
        init = self.module.methods.get("__init__")
        params = {a.arg for a in init.args.args} if init else set()
        for node in ast.walk(self.module.model) if self.module.model else []:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "register_buffer" and node.args and isinstance(node.args[0], ast.Constant):
                out[str(node.args[0].value)] = "T"
            if not isinstance(node, ast.Assign):
                continue
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    v = node.value
                    q = qualname(v.func, self.module.aliases) if isinstance(v, ast.Call) else None
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
            if isinstance(f, ast.Name) and f.id in MATH_BUILTINS:
                return self.of(ast.Tuple(elts=list(e.args)))
            q = qualname(f, self.module.aliases)
            if q and q.startswith("math."):
                return "S"
            if q and q.startswith("torch.") or isinstance(f, ast.Attribute) and self.module.is_ext_receiver(f.value):
                return "T"
            if isinstance(f, ast.Attribute):
                if f.attr in _SHAPE_METHODS:
                    return "S"
                return "T" if self.of(f.value) == "T" else "U"
        return "U"
