"""Class 4: the op watch switched off. ATen ops a kernel runs on an OpenMP worker thread are seen only by the op
watch, a RecordFunction callback (the dispatch mode is the main thread's); RecordFunction is thread-local state the
candidate's C++ can change. The work is done by ATen (relu, add) behind a decoy kernel, on the intra-op team's
last thread, after switching record functions off there, or after clearing the callbacks on every call (the watch
arms a new one per call) and adding one of its own, so that "a global callback exists" still holds.

Stopped by the watch's check after every guarded call (``runtime_guard``, ``build/op_watch.py``): on every thread of
the intra-op team, record functions must be on and a probe must reach the watch's callback; otherwise the call is
``forbidden``. The static rules refuse these names too (``checks/native.py``, defence in depth): the module runs
with ``no_native_library_compute`` off (it also refuses ``at::relu``), so what stops them is the runtime; with the
rules on they are refused before anything compiles (``test_the_static_rules_refuse_the_names``). Two intra-op
threads (``cpus=2``): with one, no worker thread exists (and the filter refuses new ones)."""
from __future__ import annotations

import pytest

from kevin_exp.bench import CheckRules
from tests.adversarial.attacks import Attack, candidate, judge, stopped

CONFIG = {"cpus": 2, "rules": CheckRules(no_native_library_compute=False), "compile_timeout_s": 600}

_HEADERS = r"""
#include <ATen/ops/add.h>
#include <ATen/ops/relu.h>
#include <ATen/record_function.h>
"""

_ON_THE_LAST_THREAD = _HEADERS + r"""
#include <omp.h>

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    #pragma omp parallel
    {
        if (omp_get_num_threads() > 1 && omp_get_thread_num() == omp_get_num_threads() - 1) {
            SWITCH_OFF
            out.copy_(at::add(at::relu(xc), xc, 0.5));
        }
    }
    return out;
}
"""

_OMP = {"cflags": ("-O2", "-fopenmp"), "ldflags": ("-fopenmp",)}

WORKER_SWITCHES_OFF = candidate(_ON_THE_LAST_THREAD.replace("SWITCH_OFF", "at::enableRecordFunction(false);"),
                                name="adv_watch_off_on_worker", **_OMP)

_DUMMY_CALLBACK = _HEADERS + r"""
static std::unique_ptr<at::ObserverContext> nothing(const at::RecordFunction&) { return nullptr; }
"""
WORKER_CLEARS_CALLBACKS = candidate(_DUMMY_CALLBACK + _ON_THE_LAST_THREAD.replace(
    "SWITCH_OFF", "at::clearCallbacks(); at::addGlobalCallback(at::RecordFunctionCallback(nothing));"),
    name="adv_watch_callbacks_cleared",
    **_OMP)

# on the main thread, switched off only while ATen works and on again before forward returns
MAIN_THREAD_SWITCH_OFF = candidate(_HEADERS + r"""
torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    at::enableRecordFunction(false);
    auto out = at::add(at::relu(xc), xc, 0.5);
    at::enableRecordFunction(true);
    return out;
}
""", name="adv_watch_off_on_main")

# the scoped form on the worker (the state is on again when the parallel region ends): see
# test_a_scoped_switch_off_on_a_worker_is_left_to_the_static_rules
WORKER_SCOPED = candidate(_ON_THE_LAST_THREAD.replace("SWITCH_OFF", "at::RecordFunctionGuard off(false);"),
                          name="adv_watch_scoped_on_worker", **_OMP)

_FORBIDDEN_OP = stopped("forbidden")

ATTACKS = [
    Attack("omp_worker_switches_record_functions_off", WORKER_SWITCHES_OFF, _FORBIDDEN_OP, rules=("runtime_torch_op",)),
    Attack("omp_worker_clears_the_callbacks", WORKER_CLEARS_CALLBACKS, _FORBIDDEN_OP, rules=("runtime_torch_op",)),
    Attack("main_thread_switch_off_restored_before_return", MAIN_THREAD_SWITCH_OFF, _FORBIDDEN_OP,
           rules=("runtime_torch_op",)),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))


def test_the_verdict_says_the_watch_was_switched_off(verdicts):
    for name in ("omp_worker_switches_record_functions_off", "omp_worker_clears_the_callbacks"):
        bad, _ = verdicts[name]
        assert "op watch switched off on a thread" in bad.reason, bad.reason
    bad, _ = verdicts["omp_worker_switches_record_functions_off"]
    assert "record functions switched off" in bad.reason, bad.reason


def test_the_static_rules_refuse_the_names():
    import ast

    from kevin_exp.bench.candidate_source import extract_specs
    from kevin_exp.bench.checks.native import native_violations

    for source, name in ((WORKER_SWITCHES_OFF, "enableRecordFunction"), (WORKER_CLEARS_CALLBACKS, "clearCallbacks"),
                         (WORKER_SCOPED, "RecordFunctionGuard")):
        spec = extract_specs(ast.parse(source)).specs[0]
        found = native_violations(spec, "cpu", CheckRules())
        assert any(v.rule == "native_library_compute" and f"{name} changes the profiler's record functions" in v.message
                   for v in found), [v.message for v in found]


def test_a_scoped_switch_off_on_a_worker_is_left_to_the_static_rules(build_cache):
    """Known not stopped at run time: record functions switched off by a guard inside the parallel region are on
    again when the region ends, before the watch checks; with the static rules on, the names are refused."""
    from tests.adversarial.attacks import config
    from tests.adversarial.conftest import evaluate_attacks

    attack = Attack("omp_worker_scoped_switch_off", WORKER_SCOPED, _FORBIDDEN_OP, rules=("native_library_compute",))
    bad, good = evaluate_attacks([attack], config(build_cache, cpus=2))[attack.name]
    judge(attack, bad, good)
