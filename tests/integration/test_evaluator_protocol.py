"""The split evaluator against candidates that attack the old single-process design, each with an honest
twin (``ok``): the reference runs and is timed in a trusted process, every call gets fresh inputs from a
secret seed and is checked, hangs are bounded by the reference's time, too-good speedups are re-timed."""
from __future__ import annotations

import pytest

from kevin_exp.bench import BenchConfig, CheckRules, Status
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.conftest import fixture_text

RELU = fixture_text("problem_relu.py")
# every draw differs from the one before it, whatever the seed (a clock's value could repeat): no seed
# determines its inputs, so they go through the shared region
DRIFTING = RELU.replace("def get_inputs():\n    return [torch.randn(M, N)]",
                        "DRAWS = [0]\n\n\ndef get_inputs():\n    DRAWS[0] += 1\n    return [torch.randn(M, N) + DRAWS[0]]")
# the attacks run at import time or in Python: with the static rules that would refuse them off, what stops
# them is the design
OPEN_RULES = CheckRules(no_timing_patch=False, no_torch_compute=False, restrict_imports=False)
# these tests count and number the calls of the schedule: without the hidden checks' extra calls
NO_HIDDEN = dict(check_distributions=False, hidden_shape_check=False)


def item(name: str) -> EvalItem:
    return EvalItem(name, RELU, fixture_text("cpu", f"{name}.py"))


@pytest.fixture(scope="module")
def evaluator(build_cache):
    config = BenchConfig(backend="cpu", timed_trials=30, warmup_trials=2, correctness_trials=3, cache_dir=build_cache,
                         rules=OPEN_RULES, recheck_speedup=1e9, **NO_HIDDEN)
    with Evaluator(config) as ev:
        yield ev


def test_patching_torch_at_import_does_not_slow_the_reference(evaluator):
    honest, patched = evaluator.evaluate([item("ok"), item("slow_reference_patch")])
    assert honest.status is Status.OK, honest.reason
    assert patched.status is Status.OK, patched.reason
    assert patched.ref_runtime_ms == honest.ref_runtime_ms  # one measurement, in the trusted process
    # the attack gains nothing; slower is its own process paying for its patches (and noise on a 2-core box)
    assert patched.speedup < 1.5 * honest.speedup, (patched.speedup, honest.speedup)


def test_a_kernel_that_caches_outputs_by_content_is_incorrect(evaluator):
    [v] = evaluator.evaluate([item("cache_by_content")])
    assert v.status is Status.INCORRECT, v.reason
    assert not v.correct and v.speedup is None


def test_a_kernel_that_caches_outputs_by_pointer_is_caught_or_gains_nothing(evaluator):
    """Whether an input's address repeats is the allocator's business: a repeat serves a stale answer (incorrect),
    no repeat means every call computed (no gain)."""
    honest, cached = evaluator.evaluate([item("ok"), item("cache_by_pointer")])
    assert honest.status is Status.OK, honest.reason
    if cached.status is Status.OK:
        assert cached.speedup <= 1.5 * honest.speedup, (cached.speedup, honest.speedup)
    else:
        assert cached.status is Status.INCORRECT and cached.speedup is None, cached.reason


def test_answers_precomputed_from_the_seeds_the_candidate_can_see_are_incorrect(evaluator):
    [v] = evaluator.evaluate([item("precompute_from_seed")])
    assert v.status is Status.INCORRECT, v.reason
    assert v.reason.startswith("trial 1/3"), v.reason


def test_computing_only_now_and_then_is_caught_on_the_first_skipped_call(evaluator):
    honest, lazy = evaluator.evaluate([item("ok"), item("correct_every_nth")])
    assert honest.status is Status.OK, honest.reason
    assert lazy.status is Status.INCORRECT, lazy.reason
    # calls 1-6 are computed (3 checks, 2 warm-ups, timed call 1); timed call 2 is the first one skipped
    assert "timed call 2 " in lazy.reason, lazy.reason


def test_every_call_is_checked_and_counted(evaluator):
    [v] = evaluator.evaluate([item("ok")])
    assert v.status is Status.OK, v.reason
    assert v.extra["checked_calls"] == 3 + 2 + 30 + 1
    assert v.correctness_trials == 3 + 1  # the last one drawn after all timing
    assert v.runtime_stats.trials == 30 and v.ref_runtime_stats.trials == 30
    assert v.outside_runtime_ms >= v.runtime_ms  # the parent's clock around each call contains the reported time


def test_a_kernel_that_skips_part_of_the_output_on_timed_calls_is_caught_at_sampled_positions(evaluator):
    """Timed calls send back only the output's values at 4,096 positions drawn after the call: a kernel that
    leaves 1% of its output unwritten escapes them with probability 0.99^4096."""
    honest, partial = evaluator.evaluate([item("ok"), item("skip_rows_when_timed")])
    assert honest.status is Status.OK, honest.reason
    assert partial.status is Status.INCORRECT, partial.reason
    assert "timed call 1 " in partial.reason and "sampled positions" in partial.reason, partial.reason


def test_the_runner_draws_each_calls_inputs_from_its_seed_and_must_draw_the_evaluators(evaluator):
    honest, tampered = evaluator.evaluate([item("ok"), item("zero_inputs_in_runner")])
    assert honest.status is Status.OK and honest.extra["inputs"] == "seeded", honest.reason
    assert tampered.status is Status.FORBIDDEN and tampered.rule == "protocol_violation", tampered.reason
    assert "differ from the evaluator's" in tampered.reason, tampered.reason


def test_inputs_that_a_seed_does_not_determine_go_through_the_shared_region(evaluator):
    assert DRIFTING != RELU
    [v] = evaluator.evaluate([EvalItem("drifting", DRIFTING, fixture_text("cpu", "ok.py"))])
    assert v.status is Status.OK and v.extra["inputs"] == "region", v.reason
    assert v.extra["checked_calls"] == 3 + 2 + 30 + 1


def test_the_reference_process_never_loads_candidate_code(evaluator):
    [v] = evaluator.evaluate([item("import_marker")])
    assert v.status is Status.OK, v.reason
    reference = evaluator._slots[0].reference()
    report = reference.call({"op": "report"}, 60)
    assert not (reference.private_dir / "kx-imported-candidate-marker").exists()
    assert report["cwd"] == str(reference.private_dir)
    assert not [m for m in report["modules"] if "fx_" in m or m.startswith("kx_") or m == "candidate"], report["modules"]
    assert not [p for p in report["shared_objects"] if str(evaluator.cache_dir) in p], report["shared_objects"]
    assert "kevin_exp.bench.worker.candidate" not in report["modules"]


def test_a_hang_on_a_fast_reference_gets_a_deadline_near_the_floor(build_cache):
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, correctness_trials=1, cache_dir=build_cache,
                         hang_floor_s=3.0, hang_factor=1.0, hang_ceiling_s=120.0)
    with Evaluator(config) as ev:
        [v] = ev.evaluate([item("hang")])
    assert v.status is Status.TIMEOUT, v.reason
    assert 3.0 <= v.time_limit_s < 5.0, v.time_limit_s  # relu on 1M floats: ms (tens on a busy box) x 8 calls
    assert v.extra["limits"]["trials_s"] == v.time_limit_s
    assert f"{v.time_limit_s:.3g} s limit" in v.reason


def test_a_too_good_speedup_is_retimed_and_an_honest_one_stays_ok(build_cache):
    # (the CPU-pressure rule off: a first timing not cached for contention leaves the recheck nothing to settle
    # against, and which reference figure stands is what this is about)
    config = BenchConfig(backend="cpu", timed_trials=20, warmup_trials=2, correctness_trials=2, cache_dir=build_cache,
                         recheck_speedup=1e-6, recheck_tolerance=2.0, reference_max_contention=1.0)
    for _ in range(2):  # measured again once on a failure, as the suite's other timing judgements are (a busy 2-core
        with Evaluator(config) as ev:  # box once timed this honest kernel at 1.21x and then 0.286x)
            [v] = ev.evaluate([item("ok")])
        if v.status is Status.OK:
            break
    assert v.status is Status.OK, v.reason
    record = v.extra["recheck"]
    assert record["first"]["status"] == record["second"]["status"] == "ok"
    assert record["first"]["runtime_ms"] > 0 and record["second"]["runtime_ms"] > 0
    # the recheck timed the reference again; both speedups are over the faster reference time
    assert v.ref_runtime_ms == record["second"]["ref_runtime_ms"] <= record["first"]["ref_runtime_ms"]
    assert v.speedup == pytest.approx(v.ref_runtime_ms / v.runtime_ms)


def wrong_on(call: int, reference: str = RELU) -> EvalItem:
    return EvalItem(f"wrong_on_{call}", reference,
                    fixture_text("cpu", "wrong_on_call.py").replace("WRONG_CALL", str(call)))


# 3 checks (calls 0-2), 2 warm-ups (3-4), 30 timed (5-34), the check after timing (35)
@pytest.mark.parametrize(("call", "where"), [(0, "trial 1/3"), (2, "trial 3/3"), (4, "warm-up call 2"),
                                             (20, "timed call 16 "), (34, "timed call 30 "),
                                             (35, "correctness check after timing")])
def test_a_wrong_output_on_any_single_call_is_caught_on_that_call(evaluator, call, where):
    """The reference checks call i before the runner is sent anything more: a wrong call i ends the run there,
    before call i+1 is staged, including the last call."""
    [v] = evaluator.evaluate([wrong_on(call)])
    assert v.status is Status.INCORRECT, v.reason
    assert where in v.reason, v.reason


def test_calls_in_chunks_are_each_checked_once_across_chunk_boundaries(build_cache):
    """Inputs through the shared region are prepared in chunks, here of 4 calls (8 MiB per call at the cpu size):
    the last call of a chunk is checked before the next chunk replaces the reference's trials."""
    config = BenchConfig(backend="cpu", timed_trials=30, warmup_trials=2, correctness_trials=3, cache_dir=build_cache,
                         rules=OPEN_RULES, recheck_speedup=1e9, chunk_bytes=32 << 20, **NO_HIDDEN)
    with Evaluator(config) as ev:
        honest, last_of_first, last_of_second = ev.evaluate(
            [EvalItem("ok", DRIFTING, fixture_text("cpu", "ok.py")), wrong_on(3, DRIFTING), wrong_on(7, DRIFTING)])
    assert honest.status is Status.OK and honest.extra["inputs"] == "region", honest.reason
    assert honest.extra["checked_calls"] == 3 + 2 + 30 + 1 and honest.correctness_trials == 4
    assert last_of_first.status is Status.INCORRECT and "warm-up call 1" in last_of_first.reason, last_of_first.reason
    assert last_of_second.status is Status.INCORRECT and "timed call 3 " in last_of_second.reason, last_of_second.reason


def test_no_reference_work_is_outstanding_while_a_call_runs(build_cache, monkeypatch):
    """Seeded calls: "go" is sent only once everything asked of the reference is answered, sampled checks too, and
    the runner is sent nothing between "ran" and the answer to that call's check (the check reads what the call
    left in the region: nothing the runner does may run before it has). Every message the parent exchanges with
    both processes is logged."""
    from kevin_exp.bench import worker_process

    log: list[tuple[str, str, str, bool]] = []  # (process, send | recv, op, a sampled check)
    send, recv = worker_process.ChildProcess.send, worker_process.ChildProcess.recv

    def who(proc) -> str:
        return "R" if type(proc).__name__ == "ReferenceProcess" else "W"

    def logged_send(proc, message):
        log.append((who(proc), "send", str(message.get("op")), message.get("sample") is not None))
        return send(proc, message)

    def logged_recv(proc, deadline):
        reply = recv(proc, deadline)
        log.append((who(proc), "recv", str(reply.get("op")) if isinstance(reply, dict) else "ended", False))
        return reply

    monkeypatch.setattr(worker_process.ChildProcess, "send", logged_send)
    monkeypatch.setattr(worker_process.ChildProcess, "recv", logged_recv)
    config = BenchConfig(backend="cpu", timed_trials=10, warmup_trials=2, correctness_trials=3, cache_dir=build_cache,
                         rules=OPEN_RULES, recheck_speedup=1e9)
    with Evaluator(config) as ev:
        [v] = ev.evaluate([item("ok")])
    assert v.status is Status.OK and v.extra["inputs"] == "seeded", v.reason
    outstanding: list[tuple[str, bool]] = []  # the reference's requests not yet answered, in order
    gos = sampled_checks = 0
    unchecked = False  # a call has run ("ran") and its check is not yet answered
    for process, direction, op, sampled in log:
        if process == "R" and direction == "send":
            outstanding.append((op, sampled))
            sampled_checks += op == "check" and sampled
        elif process == "R" and direction == "recv" and op != "ready":
            if outstanding.pop(0)[0] == "check":
                unchecked = False
        elif process == "W" and direction == "recv" and op == "ran":
            unchecked = True
        elif process == "W" and direction == "send":
            assert not outstanding, (op, outstanding)
            assert not unchecked or op == "collect", op
            gos += op == "go"
    # calibration, then every call (the hidden checks' among them: staged through the region, checked in full)
    assert gos == 20 + 3 + len(v.extra["hidden_checks"]["passed"]) + 2 + 10 + 1 and v.extra["hidden_checks"]["passed"]
    assert sampled_checks == 20 + 2 + 10  # calibration, warm-up and timed calls: checked at sampled positions
