"""What can be checked of the cuda attacks without a GPU: each candidate and honest twin parses and defines
ModelNew and one cuda extension; every honest twin passes the static rules; the attacks that the native
rules refuse before anything is built are listed (a rule that stops catching one fails here), the others
must get past them, so that what stops them is the run. The GPU runs are in ``test_cuda_timing`` and
``test_cuda_faults``."""
from __future__ import annotations

import ast

import pytest

from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.config import CheckRules
from tests.adversarial import test_cuda_faults, test_cuda_timing, test_timed_window_cuda

ATTACKS = test_cuda_timing.ATTACKS + test_cuda_faults.ATTACKS + test_timed_window_cuda.ATTACKS
SOURCES = {a.name: a.source for a in ATTACKS} | {f"{a.name}:honest": a.honest for a in ATTACKS}
# attack -> the rule that refuses it statically (bench/checks/native.py)
STATICALLY_REFUSED = {
    "cuda_cache_answers_by_input_content": "unsafe_builtin",  # mapped host memory
    "device_reset_under_torch": "unsafe_builtin",
    "kernel_on_private_stream_returns_before_it_ends": "unsafe_builtin",  # a driver function fetched by name
    "patched_cuda_event_timer_reports_less": "unsafe_builtin",  # /proc/self/mem
    "persistent_kernel_from_load_answers_a_mailbox": "unsafe_builtin",
    "pin_weight_in_persisting_l2_across_flush": "timing_patch",
    "scan_device_memory_for_expected_output": "unsafe_builtin",
    "tf32_switched_on_from_cpp": "native_library_compute",  # the global context
}


def test_attack_names_are_unique():
    assert len({a.name for a in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_candidate_parses_and_meets_the_static_rules_as_listed(name):
    source = SOURCES[name]
    tree = ast.parse(source)
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    parsed, violations = check_candidate(source, "cuda", CheckRules())
    if name in STATICALLY_REFUSED:
        assert STATICALLY_REFUSED[name] in {v.rule for v in violations}, [(v.rule, v.message) for v in violations]
        return
    assert not violations, [(v.rule, v.message) for v in violations]
    [spec] = parsed.specs
    assert spec.cuda_sources and "__global__" in spec.cuda_sources[0]
