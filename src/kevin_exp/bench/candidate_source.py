"""Static extraction of a candidate's ``load_inline`` arguments by constant folding over its AST.

The candidate is never executed here. A call whose build-relevant arguments cannot be folded is
counted in ``CandidateSource.unresolved_calls``; the worker then sees the real arguments at run time
(and the evaluator must check that spec too: static folding is an optimisation, not the guarantee).
"""
from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from kevin_exp.bench.ast_names import (
    SCOPES,
    bound_names,
    import_aliases,
    is_load_inline,
    load_inline_names,
    parent_map,
    walk_scope,
)
from kevin_exp.bench.constant_folding import MAX_LEN, UNKNOWN, Budget, Folder, fold
from kevin_exp.bench.spec import LOAD_INLINE_PARAMS, CandidateSource, ExtensionSpec

_SPEC_KEYS = (
    "name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
    "extra_ldflags", "extra_include_paths", "with_cuda",
)


@dataclass(frozen=True)
class LoadInlineCall:
    """One ``load_inline`` call site; ``spec`` is None when its arguments did not fold."""

    node: ast.Call
    line: int
    spec: ExtensionSpec | None
    too_large: bool = False  # its arguments fold to more text than the checks read


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
            folder = Folder(self.sequential_lookup, self.budget)
            value = folder.binop(stmt.op, old, right) if isinstance(stmt.op, (ast.Add, ast.Mult)) else UNKNOWN
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            self.env = {k: UNKNOWN for k in self.env}
        scope_nodes = [stmt] if isinstance(stmt, SCOPES) else [stmt, *walk_scope(stmt)]
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
            if isinstance(node, SCOPES):
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
            if isinstance(node_, SCOPES):
                return True
            node_ = self.parents.get(node_)
        return False


def _is_join_or_len(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "join") or (isinstance(f, ast.Name) and f.id == "len")


# --------------------------------------------------------------------------- call sites


def bind_call(call: ast.Call, lookup: Callable[[str], Any], budget: Budget | None = None,
              max_bytes: int = 2 * MAX_LEN) -> dict[str, Any] | None:
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
    if max_bytes > 0 and text > max_bytes:
        budget.exceeded = True
        return None
    return out if budget.spend(text) else None


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


def extract_calls(tree: ast.Module, max_bytes: int = 2 * MAX_LEN) -> list[LoadInlineCall]:
    """Every load_inline call site in source order, with its spec where it folds (``max_bytes``: the most
    text one call's arguments may fold to; 0: no bound beyond the folding budget)."""
    trusted = load_inline_names(tree, import_aliases(tree))
    calls = [n for n in ast.walk(tree) if is_load_inline(n, trusted)]
    if not calls:
        return []
    env = _ModuleEnv(tree, set(calls))
    found: list[LoadInlineCall] = []
    nested = [c for c in calls if env.in_nested_scope(c)]
    nested_ids = {id(c) for c in nested}
    by_stmt: dict[int, list[ast.Call]] = {}
    for c in calls:
        if id(c) not in nested_ids:
            top: ast.AST = c
            while not isinstance(env.parents.get(top), ast.Module):
                top = env.parents[top]
            by_stmt.setdefault(id(top), []).append(c)
    for stmt in tree.body:
        inner = by_stmt.get(id(stmt), [])
        if inner and not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, *SCOPES)):
            # compound statement (if/for/with/...): its bindings may run before the call
            for name in {n for node in walk_scope(stmt) for n in bound_names(node)}:
                env.env[name] = UNKNOWN
        for call in inner:
            found.append(_call_site(call, env.sequential_lookup, env.budget, max_bytes))
        env.bind_statement(stmt)
    # functions and class bodies may run at any time: fold against names bound exactly once
    found.extend(_call_site(call, env.nested_lookup(call), env.budget, max_bytes) for call in nested)
    return sorted(found, key=lambda c: (c.node.lineno, c.node.col_offset))


def _call_site(call: ast.Call, lookup: Callable[[str], Any], budget: Budget, max_bytes: int) -> LoadInlineCall:
    kwargs = bind_call(call, lookup, budget, max_bytes)
    spec = ExtensionSpec.from_load_inline_kwargs(kwargs) if kwargs is not None else None
    # a call that did not fold once folding refused a value for its size: the text it would scan is too large
    return LoadInlineCall(call, call.lineno, spec, too_large=spec is None and budget.exceeded)


def candidate_source(calls: list[LoadInlineCall]) -> CandidateSource:
    """The specs of the calls that folded, and how many did not."""
    return CandidateSource(
        specs=[c.spec for c in calls if c.spec is not None],
        unresolved_calls=sum(1 for c in calls if c.spec is None),
    )


def extract_specs(tree: ast.Module) -> CandidateSource:
    return candidate_source(extract_calls(tree))
