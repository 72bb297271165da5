"""Static hack defences on a candidate, before anything is built (Kevin App. F; docs/hack_defences.md and
docs/static-rules.md).

Python is checked on its AST (``python_ast``, names allowed by ``python_names``); C++/CUDA sources after
they are tokenised as the preprocessor does (``bench/native_source``, ``native``). Every rule has a switch in
``CheckRules`` (``rules``). ``check_candidate`` runs them all, within input bounds (``bounds``) and under a
hard deadline (``deadline``: the checks run in a checker process that is killed when it runs over).
"""
from __future__ import annotations

import ast
from dataclasses import replace

from kevin_exp.bench.candidate_source import candidate_source, extract_calls
from kevin_exp.bench.checks.bounds import folding_too_large, source_too_large, tree_too_large
from kevin_exp.bench.checks.deadline import run_checked
from kevin_exp.bench.checks.native import check_native, native_violations
from kevin_exp.bench.checks.python_ast import check_python
from kevin_exp.bench.checks.rules import Violation
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import CandidateSource

__all__ = ["check_candidate", "check_native", "candidate_violations", "Violation"]


def check_candidate(source: str, backend: str, rules: CheckRules) -> tuple[CandidateSource, list[Violation]]:
    """Parse (SyntaxError/RecursionError/ValueError propagate), extract specs, run all static rules, within
    the input bounds and the deadline (``too_large`` / ``check_deadline`` violations past them)."""
    too_large = source_too_large(source, rules)
    if too_large is not None:
        return CandidateSource(), [too_large]
    return run_checked("candidate", candidate_violations, (source, backend, rules), rules)


def candidate_violations(source: str, backend: str, rules: CheckRules) -> tuple[CandidateSource, list[Violation]]:
    """``check_candidate`` in this process, without the deadline."""
    too_large = source_too_large(source, rules)
    if too_large is not None:
        return CandidateSource(), [too_large]
    tree = ast.parse(source)
    too_large = tree_too_large(tree, rules)
    if too_large is not None:
        return CandidateSource(), [too_large]
    calls = extract_calls(tree, rules.max_extension_bytes)
    if any(call.too_large for call in calls):
        return candidate_source(calls), [folding_too_large(rules)]
    violations = check_python(tree, backend, rules)
    seen = set(violations)
    for call in calls:
        if call.spec is None:
            continue
        for v in native_violations(call.spec, backend, rules):
            v = replace(v, line=call.line, message=f"line {call.line}: {v.message}")
            if v not in seen:
                seen.add(v)
                violations.append(v)
    return candidate_source(calls), sorted(violations, key=lambda v: v.line or 0)
