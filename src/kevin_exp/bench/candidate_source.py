"""Static extraction of a candidate's ``load_inline`` arguments by constant folding over its AST.

The candidate is never executed here. A call whose build-relevant arguments cannot be folded is
counted in ``CandidateSource.unresolved_calls``; the worker then sees the real arguments at run time
(and the evaluator must check that spec too: static folding is an optimisation, not the guarantee).
"""
from __future__ import annotations

import ast
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from kevin_exp.bench.spec import LOAD_INLINE_PARAMS, CandidateSource, ExtensionSpec

LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
_SPEC_KEYS = (
    "name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_ldflags", "extra_include_paths", "with_cuda",
)
_MAX_LEN = 2 << 20  # largest folded string (chars); larger values stay UNKNOWN
_MAX_ITEMS = 4096  # largest folded list/tuple/dict
_BUDGET = 16 << 20  # chars/items one extraction may produce (and scan) in total
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)
_STR_METHODS = {"strip", "lstrip", "rstrip", "replace", "format", "join"}


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True)
class LoadInlineCall:
    """One ``load_inline`` call site; ``spec`` is None when its arguments did not fold."""

    node: ast.Call
    line: int
    spec: ExtensionSpec | None


# --------------------------------------------------------------------------- names and aliases


def parent_map(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted qualified name for every import in the module (any scope)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def qualname(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """Dotted name of a Name/Attribute chain (``getattr(x, "c")`` counts as ``x.c``), via aliases."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = qualname(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if is_const_getattr(node):
        base = qualname(node.args[0], aliases)  # type: ignore[attr-defined]
        return f"{base}.{node.args[1].value}" if base else None  # type: ignore[attr-defined]
    return None


def is_const_getattr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
        and len(node.args) in (2, 3) and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    )


def bound_names(node: ast.AST) -> set[str]:
    """Names a single node binds in its scope (not descending)."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return {node.id}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    if isinstance(node, ast.ExceptHandler) and node.name:
        return {node.name}
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return {node.name}
    if isinstance(node, ast.MatchMapping) and node.rest:
        return {node.rest}
    if isinstance(node, ast.arg):
        return {node.arg}
    return set()


def walk_scope(node: ast.AST):
    """Yield ``node``'s descendants in its own scope (nested scopes are yielded, not entered)."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, _SCOPES):
            yield from walk_scope(child)


def load_inline_names(tree: ast.Module, aliases: dict[str, str]) -> dict[str, str]:
    """Aliases trusted to mean load_inline: names bound only by imports, or once to such a chain.

    A candidate's own ``def load_inline`` (or any other rebinding) is not trusted: calling it builds
    nothing, so it must not count as a kernel.
    """
    counts: Counter[str] = Counter()
    by_import: Counter[str] = Counter()
    for node in ast.walk(tree):
        for name in bound_names(node):
            counts[name] += 1
            by_import[name] += isinstance(node, (ast.Import, ast.ImportFrom))
    trusted = {k: v for k, v in aliases.items() if counts[k] == by_import[k]}
    for stmt in tree.body:  # `li = torch.utils.cpp_extension.load_inline`, bound exactly once
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and counts[stmt.targets[0].id] == 1 and qualname(stmt.value, trusted) == LOAD_INLINE):
            trusted[stmt.targets[0].id] = LOAD_INLINE
    return trusted


def is_load_inline(call: ast.AST, trusted: dict[str, str]) -> bool:
    return isinstance(call, ast.Call) and qualname(call.func, trusted) == LOAD_INLINE


# --------------------------------------------------------------------------- constant folding


class Budget:
    """Characters/items folding may still produce: a candidate must not be able to stall the (parent)
    evaluator with `"x" * 10**9`, `f"{a:>999999999}"` or thousands of copies of a large constant."""

    def __init__(self, total: int = _BUDGET) -> None:
        self.left = total

    def spend(self, n: int) -> bool:
        self.left -= max(n, 0)
        return n <= _MAX_LEN and self.left >= 0


def fold(node: ast.AST, lookup: Callable[[str], Any], budget: Budget | None = None) -> Any:
    """Value of a constant expression, or UNKNOWN. Lists/tuples/dicts returned are fresh objects."""
    return _Folder(lookup, budget or Budget()).fold(node)


class _Folder:
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
                if len(items) > _MAX_ITEMS:
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
            if len(out) > _MAX_ITEMS:
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
            return left + right if self.budget.spend(n) and (isinstance(left, str) or n <= _MAX_ITEMS) else UNKNOWN
        if isinstance(right, seq):
            left, right = right, left
        if not (isinstance(left, seq) and _number(right) and isinstance(right, int) and right >= 0):
            return UNKNOWN
        n = len(left) * right
        return left * right if self.budget.spend(n) and (isinstance(left, str) or n <= _MAX_ITEMS) else UNKNOWN

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
    return all(int(n) <= 4096 for n in re.findall(r"\d+", spec))


# --------------------------------------------------------------------------- module environment


class _ModuleEnv:
    """Folded values of module-level names, in statement order and for nested scopes."""

    def __init__(self, tree: ast.Module, load_inline_calls: set[ast.Call]) -> None:
        self.tree = tree
        self.parents = parent_map(tree)
        counts: Counter[str] = Counter()
        for node in walk_scope(tree):
            for name in bound_names(node):
                counts[name] += 1
        self.counts = counts
        # Rebinding from other scopes (global, walrus) makes a name's value unknowable statically.
        self.poisoned: set[str] = set()
        self.star_import = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                self.poisoned.update(node.names)
            elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
                self.poisoned.add(node.target.id)
            elif isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                self.star_import = True
        self.escaped = self._escaped_names(load_inline_calls)
        self.env: dict[str, Any] = {}
        self.budget = Budget()

    def _escaped_names(self, calls: set[ast.Call]) -> set[str]:
        """Names loaded where a list/dict value could be mutated or aliased (``srcs.append(...)``)."""
        escaped: set[str] = set()
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            parent = self.parents.get(node)
            if isinstance(parent, ast.keyword):
                parent = self.parents.get(parent)
                if parent in calls:
                    continue
            safe = (
                isinstance(parent, ast.BinOp)
                or (isinstance(parent, ast.Call) and (parent in calls or _is_join_or_len(parent)))
                or isinstance(parent, (ast.FormattedValue, ast.Compare))
                or (isinstance(parent, ast.Starred) and isinstance(self.parents.get(parent), (ast.List, ast.Tuple)))
            )
            if not safe:
                escaped.add(node.id)
        return escaped

    def _value(self, name: str, source: dict[str, Any]) -> Any:
        if name in self.poisoned:
            return UNKNOWN
        v = source.get(name, UNKNOWN)
        return UNKNOWN if isinstance(v, (list, dict)) and name in self.escaped else v

    def sequential_lookup(self, name: str) -> Any:
        return self._value(name, self.env)

    def bind_statement(self, stmt: ast.stmt) -> None:
        """Update the environment after a top-level statement has run."""
        targets: list[ast.expr] = []
        value: Any = UNKNOWN
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, fold(stmt.value, self.sequential_lookup, self.budget)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], fold(stmt.value, self.sequential_lookup, self.budget)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            right = fold(stmt.value, self.sequential_lookup, self.budget)
            old = self.sequential_lookup(stmt.target.id)
            targets = [stmt.target]
            folder = _Folder(self.sequential_lookup, self.budget)
            value = folder.binop(stmt.op, old, right) if isinstance(stmt.op, (ast.Add, ast.Mult)) else UNKNOWN
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            self.env = {k: UNKNOWN for k in self.env}
        scope_nodes = [stmt] if isinstance(stmt, _SCOPES) else [stmt, *walk_scope(stmt)]
        for name in {n for node in scope_nodes for n in bound_names(node)}:
            self.env[name] = UNKNOWN
        for target in targets:
            if isinstance(target, ast.Name):
                self.env[target.id] = value
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (list, tuple)) \
                    and len(value) == len(target.elts) and all(isinstance(e, ast.Name) for e in target.elts):
                for elt, v in zip(target.elts, value):
                    self.env[elt.id] = v  # type: ignore[attr-defined]

    def nested_lookup(self, call: ast.Call) -> Callable[[str], Any]:
        """Lookup for a call inside a function/class/comprehension: only names bound exactly once at
        module level and not shadowed by any enclosing scope."""
        shadowed: set[str] = set()
        node: ast.AST | None = call
        while node is not None:
            node = self.parents.get(node)
            if isinstance(node, _SCOPES):
                for inner in walk_scope(node):
                    shadowed |= bound_names(inner)

        def lookup(name: str) -> Any:
            if name in shadowed or self.star_import or self.counts[name] != 1:
                return UNKNOWN
            return self.sequential_lookup(name)

        return lookup

    def in_nested_scope(self, node: ast.AST) -> bool:
        node_: ast.AST | None = self.parents.get(node)
        while node_ is not None and not isinstance(node_, ast.Module):
            if isinstance(node_, _SCOPES):
                return True
            node_ = self.parents.get(node_)
        return False


def _is_join_or_len(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "join") or (isinstance(f, ast.Name) and f.id == "len")


# --------------------------------------------------------------------------- call sites


def bind_call(call: ast.Call, lookup: Callable[[str], Any], budget: Budget | None = None) -> dict[str, Any] | None:
    """Folded spec-relevant arguments of one load_inline call, or None if they do not fold."""
    budget = budget or Budget()
    given: dict[str, ast.AST | Any] = {}
    positional: list[Any] = []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            v = fold(arg.value, lookup, budget)
            if not isinstance(v, (list, tuple)):
                return None
            positional.extend(v)
        else:
            positional.append(arg)
    if len(positional) > len(LOAD_INLINE_PARAMS):
        return None
    given.update(zip(LOAD_INLINE_PARAMS, positional))
    for kw in call.keywords:
        if kw.arg is None:
            extra = fold(kw.value, lookup, budget)
            if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra) or given.keys() & extra.keys():
                return None
            given.update(extra)
        elif kw.arg in given:
            return None  # the real call raises TypeError; leave it to run time
        else:
            given[kw.arg] = kw.value
    out: dict[str, Any] = {}
    for key in _SPEC_KEYS:
        if key not in given:
            continue
        raw = given[key]
        value = fold(raw, lookup, budget) if isinstance(raw, ast.AST) else raw
        if not _valid(key, value):
            if key == "name":
                continue  # the name is not part of the build's identity
            return None
        out[key] = value
    # the spec's text is what the native checks scan: it is charged to the same budget
    text = sum(len(v) if isinstance(v, str) else sum(map(len, v))
               for v in out.values() if isinstance(v, (str, list, tuple)))
    return out if budget.spend(text) and text <= 2 * _MAX_LEN else None


def _valid(key: str, value: Any) -> bool:
    if value is UNKNOWN:
        return False
    if key == "name":
        return isinstance(value, str)
    if key == "with_cuda":
        return value is None or isinstance(value, bool)
    if key == "functions" and isinstance(value, dict):
        return all(isinstance(k, str) for k in value)
    return value is None or isinstance(value, str) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))


def extract_calls(tree: ast.Module) -> list[LoadInlineCall]:
    """Every load_inline call site in source order, with its spec where it folds."""
    trusted = load_inline_names(tree, import_aliases(tree))
    calls = [n for n in ast.walk(tree) if is_load_inline(n, trusted)]
    if not calls:
        return []
    env = _ModuleEnv(tree, set(calls))
    found: list[LoadInlineCall] = []
    nested = [c for c in calls if env.in_nested_scope(c)]
    by_stmt: dict[int, list[ast.Call]] = {}
    for c in calls:
        if not any(c is n for n in nested):
            top: ast.AST = c
            while not isinstance(env.parents.get(top), ast.Module):
                top = env.parents[top]
            by_stmt.setdefault(id(top), []).append(c)
    for stmt in tree.body:
        inner = by_stmt.get(id(stmt), [])
        if inner and not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, *_SCOPES)):
            # compound statement (if/for/with/...): its bindings may run before the call
            for name in {n for node in walk_scope(stmt) for n in bound_names(node)}:
                env.env[name] = UNKNOWN
        for call in inner:
            found.append(_call_site(call, env.sequential_lookup, env.budget))
        env.bind_statement(stmt)
    # functions and class bodies may run at any time: fold against names bound exactly once
    found.extend(_call_site(call, env.nested_lookup(call), env.budget) for call in nested)
    return sorted(found, key=lambda c: (c.node.lineno, c.node.col_offset))


def _call_site(call: ast.Call, lookup: Callable[[str], Any], budget: Budget) -> LoadInlineCall:
    kwargs = bind_call(call, lookup, budget)
    spec = ExtensionSpec.from_load_inline_kwargs(kwargs) if kwargs is not None else None
    return LoadInlineCall(call, call.lineno, spec)


def extract_specs(tree: ast.Module) -> CandidateSource:
    calls = extract_calls(tree)
    return CandidateSource(
        specs=[c.spec for c in calls if c.spec is not None],
        unresolved_calls=sum(1 for c in calls if c.spec is None),
    )
