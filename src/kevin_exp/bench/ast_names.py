"""AST helpers shared by the ``load_inline`` extraction and the Python rules: import aliases, dotted names,
scopes, and which names may be trusted to mean ``load_inline``."""
from __future__ import annotations

import ast
from collections import Counter
from typing import Iterator

LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp)


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


def walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Yield ``node``'s descendants in its own scope (nested scopes are yielded, not entered)."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, SCOPES):
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
