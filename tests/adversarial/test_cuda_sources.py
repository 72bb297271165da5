"""What can be checked of the cuda attacks without a GPU: each candidate and honest twin parses, defines
ModelNew and one cuda extension, and passes the static rules (the attacks are written to get past them: what
must stop them is the run). The GPU runs are in ``test_cuda_timing`` and ``test_cuda_faults``."""
from __future__ import annotations

import ast

import pytest

from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.config import CheckRules
from tests.adversarial import test_cuda_faults, test_cuda_timing

ATTACKS = test_cuda_timing.ATTACKS + test_cuda_faults.ATTACKS
SOURCES = {a.name: a.source for a in ATTACKS} | {f"{a.name}:honest": a.honest for a in ATTACKS}


def test_attack_names_are_unique():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_candidate_parses_and_gets_past_the_static_rules(name):
    source = SOURCES[name]
    tree = ast.parse(source)
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    parsed, violations = check_candidate(source, "cuda", CheckRules())
    assert not violations, [(v.rule, v.message) for v in violations]
    [spec] = parsed.specs
    assert spec.cuda_sources and "__global__" in spec.cuda_sources[0]
