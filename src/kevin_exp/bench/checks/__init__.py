"""Static hack defences on a candidate, before anything is built (Kevin App. F; docs/hack_defences.md).

Python is checked on its AST (``python_ast``, names allowed by ``python_names``); C++/CUDA sources after
comments and string literals are stripped (``native``). Every rule has a switch in ``CheckRules``
(``rules``); the allow-lists and their rationale are in docs/hack_defences.md. ``check_candidate`` runs
them all.
"""
from __future__ import annotations

import ast
from dataclasses import replace

from kevin_exp.bench.candidate_source import candidate_source, extract_calls
from kevin_exp.bench.checks.native import check_native
from kevin_exp.bench.checks.python_ast import check_python
from kevin_exp.bench.checks.rules import Violation
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import CandidateSource


def check_candidate(source: str, backend: str, rules: CheckRules) -> tuple[CandidateSource, list[Violation]]:
    """Parse (SyntaxError/RecursionError/ValueError propagate), extract specs, run all static rules."""
    tree = ast.parse(source)
    calls = extract_calls(tree)
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
    return candidate_source(calls), sorted(violations, key=lambda v: v.line or 0)
