"""The Python rules that keep a candidate away from the interpreter's internals, judged on what an
expression reaches rather than how it is spelt (docs/static-rules.md):

- attribute names that only lead to internals (frames, generators, tracebacks, code objects, the method
  resolution order, stdlib modules that torch or typing re-export, torch's op registry and private names)
  are refused on **any** receiver: a call's result, a subscript, a container, a lambda's return value;
- a module object may only be used as the receiver of an attribute access or in a plain alias assignment
  (``F2 = F``, followed by the rules), never as a value (``[torch][0]``, ``f(torch)``, ``lambda: torch``,
  default arguments, walrus, comprehensions), so every use of a module stays a chain the rules resolve;
- private attributes (``_x``) only on ``self``/``cls``/``ctx`` and the candidate's own classes;
- ``setattr``/``delattr`` only on ``self`` with a constant public name, ``getattr``/``hasattr`` only with a
  constant public name, ``type`` with one argument, no dunder-looking strings (also when they only appear
  after constant folding, ``"__glo" + "bals__"``).
"""
from __future__ import annotations

import ast
import re

from kevin_exp.bench.ast_names import qualname
from kevin_exp.bench.checks.python_names import ALLOWED_IMPORTS, INTERNAL_ATTRS
from kevin_exp.bench.checks.rules import words
from kevin_exp.bench.constant_folding import UNKNOWN, Budget, fold

# Values of these qualified names are modules: they may be attribute receivers, never values.
MODULES = ALLOWED_IMPORTS | words("""torch.autograd torch.nn.parameter torch.nn.modules torch.backends torch.jit
    torch.ops torch.library torch.fx torch.utils.data torch.cuda.amp torch.amp torch.testing""")
PRIVATE_RECEIVERS = words("self cls ctx")
_DUNDER = re.compile(r"__\w+__")
# (CUDA qualifiers are no Python attributes: a candidate may build its kernel source from them)
_DUNDER_STRINGS_OK = words("""__main__ __init__ __name__ __doc__ __file__ __global__ __device__ __host__ __shared__
    __constant__ __restrict__ __forceinline__ __noinline__ __launch_bounds__ __managed__""")
_FOLD_BUDGET = 1 << 20
_REFLECTION = frozenset(("getattr", "setattr", "delattr", "hasattr", "type"))


def is_dunder(name: str) -> bool:
    return _DUNDER.fullmatch(name) is not None


class InterpreterReach:
    """Mixed into ``PythonChecker`` (which provides ``add``, ``aliases``, ``parents``, ``tree`` and
    ``_is_builtin_ref``)."""

    def _reach_init(self) -> None:
        tree: ast.Module = self.tree  # type: ignore[attr-defined]
        self._own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self._fold_budget = Budget(_FOLD_BUDGET)

    def check_reach(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            self._check_attr_name(node, node.attr, node.value)
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            self._check_module_value(node)
        if isinstance(node, ast.Call):
            self._check_reflection_call(node)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self._check_reflection_value(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and is_dunder(node.value.strip()) \
                and node.value.strip() not in _DUNDER_STRINGS_OK:
            self.add("unsafe_builtin", node, f"the string {node.value!r} names a special attribute; "  # type: ignore[attr-defined]
                     "dunder names are not allowed")
        if isinstance(node, (ast.BinOp, ast.JoinedStr)) or (isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) and node.func.attr in ("join", "format", "replace")):
            self._check_folded_string(node)

    def _check_attr_name(self, node: ast.AST, attr: str, receiver: ast.AST) -> None:
        if attr in INTERNAL_ATTRS and qualname(receiver, self.aliases) is None:  # resolved chains: classify_chain
            self.add("unsafe_builtin", node, f"`.{attr}` reaches interpreter internals (frames, modules, "  # type: ignore[attr-defined]
                     "the op registry); not allowed on any object")
        elif attr.startswith("_") and not is_dunder(attr) and qualname(receiver, self.aliases) is None \
                and not (isinstance(receiver, ast.Name) and (receiver.id in PRIVATE_RECEIVERS
                                                             or receiver.id in self._own_classes)):
            self.add("unsafe_builtin", node, f"`.{attr}` is a private attribute of an object that is not the "  # type: ignore[attr-defined]
                     "candidate's own (self, cls, ctx or its classes); not allowed")

    def _check_module_value(self, node: ast.Name | ast.Attribute) -> None:
        q = qualname(node, self.aliases)  # type: ignore[attr-defined]
        if q not in MODULES:
            return
        parent = self.parents.get(node)  # type: ignore[attr-defined]
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return
        if isinstance(parent, ast.Call) and parent.func is node:
            return
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in ("getattr", "hasattr") \
                and parent.args and parent.args[0] is node:
            return  # getattr(torch, "name"): resolved like torch.name
        if isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1 \
                and isinstance(parent.targets[0], ast.Name) and not isinstance(self.parents.get(parent), ast.ClassDef):
            return  # an alias, followed by the rules (a class attribute would be reached as `A.m`, unresolved)
        self.add("unsafe_builtin", node, f"the module {q} is used as a value; modules may only be used as "  # type: ignore[attr-defined]
                 f"`{q.split('.')[-1]}.name` (a module passed around escapes these checks)")

    def _check_reflection_value(self, node: ast.Name) -> None:
        """`g = getattr; g(x, name)` would escape the call checks below."""
        parent = self.parents.get(node)  # type: ignore[attr-defined]
        if node.id in _REFLECTION and not (isinstance(parent, ast.Call) and parent.func is node) \
                and self._is_builtin_ref(node):  # type: ignore[attr-defined]
            self.add("unsafe_builtin", node, f"the builtin {node.id} may only be called directly, not passed "  # type: ignore[attr-defined]
                     "around or renamed")

    def _check_reflection_call(self, node: ast.Call) -> None:
        f = node.func
        if not (isinstance(f, ast.Name) and self._is_builtin_ref(f)):  # type: ignore[attr-defined]
            return
        args = node.args
        name_arg = args[1] if len(args) >= 2 else None
        const_name = name_arg.value if isinstance(name_arg, ast.Constant) and isinstance(name_arg.value, str) \
            else None
        if f.id in ("setattr", "delattr"):
            on_self = bool(args) and isinstance(args[0], ast.Name) and args[0].id == "self"
            if not on_self or const_name is None or is_dunder(const_name) or const_name.startswith("_"):
                self.add("unsafe_builtin", node, f"{f.id} is only allowed on self with a constant public "  # type: ignore[attr-defined]
                         "attribute name; assign attributes directly")
        elif f.id in ("getattr", "hasattr") and const_name is not None:
            self._check_attr_name(node, const_name, args[0])
        elif f.id == "type" and (len(args) != 1 or node.keywords):
            self.add("unsafe_builtin", node, "type() with more than one argument creates classes at run time; "  # type: ignore[attr-defined]
                     "not allowed (write a class statement)")

    def _check_folded_string(self, node: ast.AST) -> None:
        parent = self.parents.get(node)  # type: ignore[attr-defined]
        if isinstance(parent, (ast.BinOp, ast.JoinedStr, ast.FormattedValue)):
            return  # folded with its outermost expression
        value = fold(node, lambda _name: UNKNOWN, self._fold_budget)
        if isinstance(value, str) and len(value) <= 64 and is_dunder(value.strip()) \
                and value.strip() not in _DUNDER_STRINGS_OK:
            self.add("unsafe_builtin", node, f"`{ast.unparse(node)[:60]}` builds the special name "  # type: ignore[attr-defined]
                     f"{value.strip()!r}; dunder names are not allowed")
