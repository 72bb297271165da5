"""Constant folding over a candidate's AST (literals, names, string/list arithmetic, displays, f-strings and
a few str methods), within size limits. The candidate is never executed."""
from __future__ import annotations

import ast
import re
import string
from typing import Any, Callable

MAX_LEN = 2 << 20  # largest folded string (chars); larger values stay UNKNOWN
MAX_ITEMS = 4096  # largest folded list/tuple/dict
_BUDGET = 16 << 20  # chars/items one extraction may produce (and scan) in total
_STR_METHODS = {"strip", "lstrip", "rstrip", "replace", "format", "join"}


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


class Budget:
    """Characters/items folding may still produce: a candidate must not be able to stall the (parent)
    evaluator with `"x" * 10**9`, `f"{a:>999999999}"` or thousands of copies of a large constant."""

    def __init__(self, total: int = _BUDGET) -> None:
        self.left = total
        self.exceeded = False  # some value was refused for its size

    def spend(self, n: int) -> bool:
        self.left -= max(n, 0)
        ok = n <= MAX_LEN and self.left >= 0
        self.exceeded |= not ok
        return ok


def fold(node: ast.AST, lookup: Callable[[str], Any], budget: Budget | None = None) -> Any:
    """Value of a constant expression, or UNKNOWN. Lists/tuples/dicts returned are fresh objects."""
    return Folder(lookup, budget or Budget()).fold(node)


class Folder:
    def __init__(self, lookup: Callable[[str], Any], budget: Budget) -> None:
        self.lookup, self.budget = lookup, budget

    def fold(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            v = node.value
            return v if v is None or isinstance(v, (str, float, bool)) or _small_int(v) else UNKNOWN
        if isinstance(node, ast.Name):
            v = self.lookup(node.id)
            if isinstance(v, (list, dict)):
                return (list(v) if isinstance(v, list) else dict(v)) if self.budget.spend(len(v)) else UNKNOWN
            return v
        if isinstance(node, (ast.List, ast.Tuple)):
            items: list[Any] = []
            for elt in node.elts:
                v = self.fold(elt.value if isinstance(elt, ast.Starred) else elt)
                if v is UNKNOWN or (isinstance(elt, ast.Starred) and not isinstance(v, (list, tuple))):
                    return UNKNOWN
                items.extend(v) if isinstance(elt, ast.Starred) else items.append(v)
                if len(items) > MAX_ITEMS:
                    return UNKNOWN
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict):
            return self._dict(node)
        if isinstance(node, ast.JoinedStr):
            return self._fstring(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            return self.binop(node.op, self.fold(node.left), self.fold(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STR_METHODS:
            return self._str_method(node)
        return UNKNOWN

    def _dict(self, node: ast.Dict) -> Any:
        out: dict[Any, Any] = {}
        for k, v_node in zip(node.keys, node.values):
            v = self.fold(v_node)
            if k is None:
                if not isinstance(v, dict):
                    return UNKNOWN
                out.update(v)
            else:
                key = self.fold(k)
                if v is UNKNOWN or key is UNKNOWN or isinstance(key, (list, dict)):
                    return UNKNOWN
                out[key] = v
            if len(out) > MAX_ITEMS:
                return UNKNOWN
        return out

    def _fstring(self, node: ast.JoinedStr) -> Any:
        parts: list[str] = []
        for p in node.values:
            if isinstance(p, ast.Constant) and isinstance(p.value, str):
                text = p.value
            elif isinstance(p, ast.FormattedValue):
                v = self.fold(p.value)
                spec = self.fold(p.format_spec) if p.format_spec else ""
                if v is UNKNOWN or not _scalar(v) or not isinstance(spec, str) or not _spec_ok(spec):
                    return UNKNOWN
                v = {-1: v, 115: str(v), 114: repr(v), 97: ascii(v)}.get(p.conversion, UNKNOWN)
                try:
                    text = format(v, spec)
                except (ValueError, TypeError):
                    return UNKNOWN
            else:
                return UNKNOWN
            if not self.budget.spend(len(text)):
                return UNKNOWN
            parts.append(text)
        return "".join(parts)

    def binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        seq = (str, list, tuple)
        if _number(left) and _number(right):
            result = left + right if isinstance(op, ast.Add) else left * right
            return result if not isinstance(result, int) or _small_int(result) else UNKNOWN
        if isinstance(op, ast.Add):
            if not (isinstance(left, seq) and type(left) is type(right)):
                return UNKNOWN
            n = len(left) + len(right)
            return left + right if self.budget.spend(n) and (isinstance(left, str) or n <= MAX_ITEMS) else UNKNOWN
        if isinstance(right, seq):
            left, right = right, left
        if not (isinstance(left, seq) and _number(right) and isinstance(right, int) and right >= 0):
            return UNKNOWN
        n = len(left) * right
        return left * right if self.budget.spend(n) and (isinstance(left, str) or n <= MAX_ITEMS) else UNKNOWN

    def _str_method(self, node: ast.Call) -> Any:
        receiver = self.fold(node.func.value)  # type: ignore[attr-defined]
        if not isinstance(receiver, str) or any(isinstance(a, ast.Starred) for a in node.args):
            return UNKNOWN
        args = [self.fold(a) for a in node.args]
        kwargs = {k.arg: self.fold(k.value) for k in node.keywords}
        if None in kwargs or any(v is UNKNOWN for v in [*args, *kwargs.values()]):
            return UNKNOWN
        method = node.func.attr  # type: ignore[attr-defined]
        if method == "format":
            values = [*args, *kwargs.values()]
            if not all(_scalar(v) for v in values):
                return UNKNOWN
            try:  # plain fields only: no attribute or index lookups inside format strings
                fields = list(string.Formatter().parse(receiver))
            except ValueError:
                return UNKNOWN
            if any(f and not (f.isdigit() or f.isidentifier()) or not _spec_ok(sp or "") for _, f, sp, _ in fields):
                return UNKNOWN
            widest = max((len(str(v)) for v in values), default=0)
            if not self.budget.spend(len(receiver) + len(fields) * widest):
                return UNKNOWN
            try:
                return receiver.format(*args, **kwargs)
            except (ValueError, KeyError, IndexError, TypeError):
                return UNKNOWN
        if method == "join":
            if kwargs or len(args) != 1 or not isinstance(args[0], (list, tuple)):
                return UNKNOWN
            items = args[0]
            if not all(isinstance(v, str) for v in items):
                return UNKNOWN
            n = sum(map(len, items)) + len(receiver) * len(items)
            return receiver.join(items) if self.budget.spend(n) else UNKNOWN
        if kwargs or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in args):
            return UNKNOWN
        if method == "replace":
            if len(args) < 2 or not all(isinstance(a, str) for a in args[:2]):
                return UNKNOWN
            growth = receiver.count(args[0]) * max(len(args[1]) - len(args[0]), 0)
            if not self.budget.spend(len(receiver) + growth):
                return UNKNOWN
        try:
            return getattr(receiver, method)(*args)
        except (TypeError, ValueError):
            return UNKNOWN


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, float, bool)) or _small_int(v)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _small_int(v: Any) -> bool:
    return isinstance(v, int) and (isinstance(v, bool) or v.bit_length() <= 64)


def _spec_ok(spec: str) -> bool:
    """Format specs without huge widths or precisions (`{x:>999999999}` would allocate a GB)."""
    return all(len(n) <= 4 and int(n) <= 4096 for n in re.findall(r"\d+", spec))

