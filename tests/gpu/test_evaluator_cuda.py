"""The evaluator on the cuda backend (run on a GPU machine; skipped elsewhere)."""
from __future__ import annotations

import pytest

from kevin_exp.bench import BenchConfig, CheckRules, Status
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.conftest import fixture_text

pytestmark = pytest.mark.gpu

RELU = fixture_text("problem_relu.py")


def item(name: str) -> EvalItem:
    return EvalItem(name, RELU, fixture_text("cuda", f"{name}.py"))


@pytest.fixture(scope="module")
def evaluator(build_cache):
    with Evaluator(BenchConfig(backend="cuda", hang_ceiling_s=60, cache_dir=build_cache)) as ev:
        yield ev


def test_correct_cuda_kernel_is_ok(evaluator):
    [v] = evaluator.evaluate([item("ok")])
    assert v.status is Status.OK, v.feedback
    assert v.speedup > 0.5 and v.runtime_stats.trials == 100
    # every call on fresh inputs, every output checked; and the hidden checks (other distributions, a hidden size)
    hidden = v.extra["hidden_checks"]
    assert hidden["failed"] is None and sorted(hidden["passed"]) == sorted(hidden["available"]) and hidden["available"]
    assert v.extra["checked_calls"] == 5 + len(hidden["passed"]) + 5 + 100 + 1
    floor = v.extra["floor"]  # the device's rated bandwidth and its L2, and an honest kernel above the floor
    assert floor["bandwidth_gbs"] >= 1500 and floor["cache_bytes"] > 0 and floor["floor_ms"] < v.runtime_ms
    assert v.outside_runtime_ms >= v.runtime_ms
    timing = v.extra["timing"]  # the parent's clock brackets only the call: its bound is recorded with the report
    assert timing["calibration_overhead_ms"] is not None and timing["used_ms"] == pytest.approx(v.runtime_ms, rel=1e-6)
    assert timing["used_ms"] == pytest.approx(max(timing["reported_ms"], timing["outside_bound_ms"]), rel=1e-6)
    assert "H100" in v.device or "H200" in v.device or v.device
    # the outputs went device to device into the reference process's allocation (no host copy per call)
    assert v.extra["exchange"]["where"] == "device", v.extra["exchange"]


def test_the_host_region_gives_the_verdicts_the_device_region_gives(build_cache):
    with Evaluator(BenchConfig(backend="cuda", hang_ceiling_s=60, cache_dir=build_cache, device_exchange=False)) as ev:
        verdicts = ev.evaluate([item("ok"), item("wrong"), item("mutate_inputs")])
    assert [v.status for v in verdicts] == [Status.OK, Status.INCORRECT, Status.INCORRECT], [v.feedback for v in verdicts]
    assert all(v.extra["exchange"] == {"where": "host"} for v in verdicts)


@pytest.mark.parametrize("name", ["wrong", "unwritten_output", "mutate_inputs"])
def test_wrong_outputs_are_incorrect(evaluator, name):
    [v] = evaluator.evaluate([item(name)])
    assert v.status is Status.INCORRECT, v.feedback


def test_side_stream_static_rule(evaluator):
    [v] = evaluator.evaluate([item("side_stream")])
    assert v.status is Status.FORBIDDEN and v.rule == "concurrency"


def test_side_stream_work_is_timed(build_cache):
    """With the static rule off, work on a private C++ stream still counts: no fake speedup."""
    config = BenchConfig(backend="cuda", cache_dir=build_cache, rules=CheckRules(no_concurrency=False))
    with Evaluator(config) as ev:
        honest, side = ev.evaluate([item("ok"), item("side_stream")])
    assert side.status is Status.OK, side.feedback
    assert not side.excessive_speedup
    assert side.speedup < 2 * honest.speedup


def test_illegal_memory_access_then_next_candidate(evaluator):
    bad, good = evaluator.evaluate([item("illegal_memory"), item("ok")])
    assert bad.status in (Status.RUNTIME_ERROR, Status.CRASHED), bad.feedback
    assert good.status is Status.OK, good.feedback


def test_hanging_kernel_times_out(build_cache):
    with Evaluator(BenchConfig(backend="cuda", hang_floor_s=5, hang_ceiling_s=30, cache_dir=build_cache)) as ev:
        hang, good = ev.evaluate([item("hang"), item("ok")])
    assert hang.status is Status.TIMEOUT
    assert 5 <= hang.time_limit_s < 10, hang.time_limit_s  # scaled from a sub-millisecond reference
    assert good.status is Status.OK, good.feedback


def test_cache_hit_on_second_evaluation(evaluator):
    evaluator.evaluate([item("ok")])
    [v] = evaluator.evaluate([item("ok")])
    assert v.cache_hit and v.compile_s == 0.0
    assert v.extra["ref_timing_cached"]  # the reference was timed once, by the trusted process


def test_builtin_cuda_solutions_are_correct(evaluator):
    from kevin_exp.tasks import load_builtin

    problems = load_builtin()
    items = [EvalItem(p.problem_id, p.source, p.solution("cuda")) for p in problems]
    verdicts = evaluator.evaluate(items)
    failures = {v.problem_id: v.feedback for v in verdicts if v.status is not Status.OK}
    assert not failures, failures
    assert {v.extra["exchange"]["where"] for v in verdicts} == {"device"}
    slow_refs = {v.problem_id: v.ref_runtime_ms for v in verdicts if v.ref_runtime_ms < 0.1}
    assert not slow_refs, f"reference under 0.1 ms on this GPU: {slow_refs}"


def test_cuda_runners_forked_from_the_server_give_the_verdicts_execd_ones_give(build_cache):
    """On a GPU the fork server must fork (a server with a thread after importing torch's CUDA build, or a CUDA
    context a fork would break, would fall back to exec): the same verdicts both ways, CUDA faults included."""
    names = ["ok", "wrong", "illegal_memory", "ok"]
    verdicts = {}
    for how in ("exec", "fork"):
        config = BenchConfig(backend="cuda", hang_ceiling_s=60, cache_dir=build_cache, worker_start=how)
        with Evaluator(config) as ev:
            verdicts[how] = ev.evaluate([item(n) for n in names])
            assert ev.isolation().endswith("runners start by fork (from a warm fork server)" if how == "fork"
                                           else "runners start by exec")
    for how, got in verdicts.items():
        statuses = [v.status for v in got]
        assert statuses[:2] == [Status.OK, Status.INCORRECT] and statuses[3] is Status.OK, (how, [v.reason for v in got])
        # where the fault surfaces (the call's error, or the process's death) is the driver's timing, either way
        assert statuses[2] in (Status.RUNTIME_ERROR, Status.CRASHED), (how, got[2].reason)
