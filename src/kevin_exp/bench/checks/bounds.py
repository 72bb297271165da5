"""Input bounds of the static checks (``CheckRules.max_*``): past one, the verdict is ``forbidden`` with rule
``too_large`` before any rule looks at the candidate, so that no input size makes the checks slow."""
from __future__ import annotations

import ast

from kevin_exp.bench.checks.rules import Violation
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

TOO_LARGE = "too_large"


def _over(limit: int, actual: int) -> bool:
    return limit > 0 and actual > limit


def too_large(what: str, field: str, limit: int) -> Violation:
    return Violation(TOO_LARGE, f"{what} exceeds the static checks' bound ({field}={limit}); write a smaller "
                     "program")


def source_too_large(source: str, rules: CheckRules) -> Violation | None:
    size = len(source.encode("utf-8", "replace"))
    if _over(rules.max_check_source_bytes, size):
        return too_large(f"the candidate source ({size} bytes)", "max_check_source_bytes", rules.max_check_source_bytes)
    return None


def tree_too_large(tree: ast.AST, rules: CheckRules) -> Violation | None:
    """Node count and nesting depth, iteratively (stops at the first bound passed)."""
    count = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if _over(rules.max_ast_nodes, count):
            return too_large(f"the candidate's syntax tree (over {rules.max_ast_nodes} nodes)", "max_ast_nodes",
                             rules.max_ast_nodes)
        if _over(rules.max_ast_depth, depth):
            return too_large(f"the candidate's nesting (over {rules.max_ast_depth} levels deep)", "max_ast_depth",
                             rules.max_ast_depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return None


def extension_too_large(spec: ExtensionSpec, rules: CheckRules) -> Violation | None:
    sources = len(spec.cpp_sources) + len(spec.cuda_sources)
    if _over(rules.max_extension_sources, sources):
        return too_large(f"extension {spec.name!r} ({sources} source strings)", "max_extension_sources",
                         rules.max_extension_sources)
    texts = (*spec.cpp_sources, *spec.cuda_sources, *spec.extra_cflags, *spec.extra_cuda_cflags,
             *spec.extra_ldflags, *spec.extra_include_paths, *(spec.functions or ()))
    size = sum(len(t.encode("utf-8", "replace")) for t in texts)
    if _over(rules.max_extension_bytes, size):
        return too_large(f"extension {spec.name!r} ({size} bytes of sources and flags)", "max_extension_bytes",
                         rules.max_extension_bytes)
    return None


def folding_too_large(rules: CheckRules) -> Violation:
    return too_large("a load_inline argument folds to more text than the checks read", "max_extension_bytes",
                     rules.max_extension_bytes)
