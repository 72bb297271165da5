"""The verdict on a run, built from what the parent saw of it: no process, no compile, no I/O."""
from __future__ import annotations

import pytest

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.protocol import chunk_plan, schedule, trial_limit_s
from kevin_exp.bench.run_outcome import RunOutcome
from kevin_exp.bench.verdict import (
    Status,
    TimingStats,
    Verdict,
    apply_recheck,
    apply_remeasure,
    make_verdict,
    needs_recheck,
    needs_remeasure,
    rechecks_disagree,
    reported_exceeds_outside,
    verdict_from_run,
)
from kevin_exp.bench.worker_process import Ended

CONFIG = BenchConfig(feedback_chars=400, excessive_speedup=10.0, hang_floor_s=10.0, hang_ceiling_s=30.0, memory_limit_gb=4.0)
ISOLATION = "process(new session, rlimits)"
LIMITS = {"load_s": 60.0, "trials_s": 12.5}


def outcome(status: str = "ok", **kw) -> RunOutcome:
    fields = dict(device="cpu: test", limits=dict(LIMITS), phases={"load_s": 0.1}, correctness_trials=5,
                  max_abs_diff=1e-6, checked_calls=8)
    fields.update(kw)
    return RunOutcome(status=status, **fields)


def ok_outcome(ref_ms: float, new_ms: float, outside_ms: float | None = None) -> RunOutcome:
    return outcome(new_ms=[new_ms] * 3, ref_ms=[ref_ms] * 3, outside_ms=[new_ms + 0.5 if outside_ms is None else outside_ms] * 3)


def judge(o: RunOutcome, config: BenchConfig = CONFIG) -> Verdict:
    return verdict_from_run("p1", o, config, isolation=ISOLATION, compile_s=2.5, run_s=1.25, cache_hit=True)


def test_ok_carries_the_speedup_timings_limit_and_the_run_record():
    v = judge(ok_outcome(ref_ms=4.0, new_ms=2.0))
    assert v.status is Status.OK and v.correct and v.rule is None
    assert v.speedup == pytest.approx(2.0) and not v.excessive_speedup
    assert (v.runtime_ms, v.ref_runtime_ms, v.outside_runtime_ms) == (2.0, 4.0, 2.5)
    assert v.runtime_stats == TimingStats.from_samples([2.0] * 3) and v.ref_runtime_stats.median_ms == 4.0
    assert v.reason == "correct; speedup 2x over PyTorch eager (4 ms -> 2 ms, min of 3 timed calls)" == v.feedback
    assert (v.correctness_trials, v.max_abs_diff, v.atol, v.rtol) == (5, 1e-6, 1e-2, 1e-2)
    assert v.time_limit_s == 12.5 and v.extra["limits"] == LIMITS and v.extra["phases"] == {"load_s": 0.1}
    assert (v.problem_id, v.device, v.backend, v.isolation) == ("p1", "cpu: test", "cpu", ISOLATION)
    assert (v.compile_s, v.run_s, v.cache_hit) == (2.5, 1.25, True)
    assert Verdict.from_json(v.to_json()) == v


@pytest.mark.parametrize("statistic, speedup", [("min", 3.0 / 1.5), ("median", 5.0 / 2.0)])
def test_the_speedup_takes_one_statistic_from_both_the_candidates_and_the_references_calls(statistic, speedup):
    o = outcome(new_ms=[2.0, 1.5, 2.5], ref_ms=[5.0, 3.0, 6.0], outside_ms=[2.5, 2.0, 3.0])
    v = judge(o, BenchConfig(timing_statistic=statistic))
    assert v.status is Status.OK and v.speedup == pytest.approx(speedup)
    assert v.extra["timing"]["statistic"] == statistic and f"{statistic} of 3 timed calls" in v.reason
    assert v.runtime_stats.min_ms == 1.5 and v.runtime_stats.median_ms == 2.0  # both kept whichever is used


def test_an_unknown_timing_statistic_is_refused():
    with pytest.raises(ValueError, match="timing_statistic='mean'"):
        BenchConfig(timing_statistic="mean")


@pytest.mark.parametrize("ref_ms, new_ms, flagged", [(10.0, 1.0, False), (10.5, 1.0, True), (1.0, 0.0, True)])
def test_a_speedup_above_the_threshold_is_flagged_but_still_ok(ref_ms, new_ms, flagged):
    v = judge(ok_outcome(ref_ms, new_ms))
    assert v.status is Status.OK and v.correct
    assert v.excessive_speedup is flagged
    assert ("flagged: speedup above 10x" in v.reason) is flagged
    if new_ms == 0.0:
        assert v.speedup == float("inf")


def test_a_reported_time_longer_than_the_outside_measure_is_suspect():
    v = judge(ok_outcome(ref_ms=4.0, new_ms=2.0, outside_ms=1.0))
    assert v.status is Status.SUSPECT and not v.correct and v.rule == "timing_inconsistent"
    assert v.runtime_ms == 2.0 and v.outside_runtime_ms == 1.0  # both recorded
    assert reported_exceeds_outside([1.0, 2.0, 3.0], [1.5, 1.9, 3.0]) == [1]


def test_incorrect_keeps_the_reason_and_no_timings():
    v = judge(outcome("incorrect", reason="trial 1/5: output mismatch", detail="ignored"))
    assert v.status is Status.INCORRECT and not v.correct
    assert v.reason == v.feedback == "trial 1/5: output mismatch"
    assert v.speedup is None and v.runtime_stats is None and not v.excessive_speedup
    assert v.correctness_trials == 5 and v.device == "cpu: test"


def test_a_runtime_error_adds_the_traceback_to_the_feedback():
    v = judge(outcome("runtime_error", reason="your forward raised: ValueError: x", detail="Traceback ...\nValueError: x"))
    assert v.status is Status.RUNTIME_ERROR
    assert v.reason == "your forward raised: ValueError: x"
    assert v.feedback == "your forward raised: ValueError: x\nTraceback ...\nValueError: x"


def test_a_runtime_rule_reported_by_the_runner_is_forbidden_with_its_rule():
    v = judge(outcome("forbidden", reason="forward called the PyTorch op mm", rule="runtime_torch_op"))
    assert v.status is Status.FORBIDDEN and v.rule == "runtime_torch_op" and not v.correct


def test_a_failed_reference_is_an_evaluator_error():
    v = judge(outcome("reference_failed", reason="the reference program failed: ValueError: x"))
    assert v.status is Status.CRASHED and v.reason.startswith("evaluator error: the reference program failed")


def test_timeout_names_the_applied_limit_and_the_phase():
    v = judge(outcome("ended", ended=Ended("timeout"), phase="trials", trial=7))
    assert v.status is Status.TIMEOUT and v.reason.startswith("the run exceeded its 12.5 s limit during call 8")
    assert v.time_limit_s == 12.5
    v = judge(outcome("ended", ended=Ended("timeout"), phase="load"))
    assert v.reason.startswith("the run exceeded its 60 s limit during loading your module")
    v = judge(outcome("ended", ended=Ended("memory"), returncode=-9))
    assert v.status is Status.CRASHED and v.reason == "the run exceeded the 4 GB memory limit"


@pytest.mark.parametrize("returncode, signal, tail, how", [
    (-11, "SIGSEGV", "Fatal Python error: Segmentation fault", "killed by SIGSEGV"),
    (3, None, "", "exited with code 3"),
])
def test_an_exit_without_a_result_is_a_crash_that_says_how(returncode, signal, tail, how):
    v = judge(outcome("ended", ended=Ended("exited"), returncode=returncode, signal=signal, output_tail=tail))
    assert v.status is Status.CRASHED and not v.correct
    assert v.reason == f"the process running your code {how} before reporting a result"
    assert v.feedback == v.reason + (f"\n{tail}" if tail else "")


def test_a_cuda_error_is_named_and_long_output_is_trimmed():
    tail = "x" * 5000 + "\nCUDA error: an illegal memory access was encountered"
    v = judge(outcome("ended", ended=Ended("exited"), returncode=-6, signal="SIGABRT", output_tail=tail))
    assert v.status is Status.CRASHED and v.reason.endswith("(CUDA error)")
    assert len(v.feedback) <= CONFIG.feedback_chars + len("\n[... trimmed ...]\n")
    assert v.feedback.startswith(v.reason)


@pytest.mark.parametrize("first, second, tolerance, disagree", [
    (8.0, 7.0, 1.5, False), (8.0, 5.0, 1.5, True), (5.0, 8.0, 1.5, True), (8.0, 8.0, 1.0, False), (8.0, 0.0, 1.5, True),
])
def test_rechecks_disagree_beyond_the_tolerance_factor_either_way(first, second, tolerance, disagree):
    assert rechecks_disagree(first, second, tolerance) is disagree


def test_a_recheck_that_disagrees_makes_the_verdict_suspect_with_both_timings():
    config = BenchConfig(recheck_speedup=5.0, recheck_tolerance=1.5)
    first = judge(ok_outcome(ref_ms=80.0, new_ms=1.0), config)
    assert needs_recheck(first, config)
    second = judge(ok_outcome(ref_ms=80.0, new_ms=20.0), config)
    v = apply_recheck(first, second, config)
    assert v.status is Status.SUSPECT and not v.correct and v.rule == "recheck_disagrees"
    record = v.extra["recheck"]
    assert (record["first"]["speedup"], record["second"]["speedup"]) == (80.0, 4.0)
    assert "re-timed" in v.reason


def test_a_recheck_that_agrees_keeps_ok_and_one_that_fails_is_the_failure():
    config = BenchConfig(recheck_speedup=5.0, recheck_tolerance=1.5)
    first = judge(ok_outcome(ref_ms=80.0, new_ms=1.0), config)
    v = apply_recheck(first, judge(ok_outcome(ref_ms=80.0, new_ms=1.2), config), config)
    assert v.status is Status.OK and v.correct and v.extra["recheck"]["second"]["runtime_ms"] == 1.2
    first = judge(ok_outcome(ref_ms=80.0, new_ms=1.0), config)
    v = apply_recheck(first, judge(outcome("incorrect", reason="wrong output on timed call 3: x"), config), config)
    assert v.status is Status.INCORRECT and "recheck after a 80x speedup" in v.reason
    assert not needs_recheck(judge(ok_outcome(ref_ms=4.0, new_ms=1.0), config), config)


def test_the_trial_limit_scales_with_the_reference_between_floor_and_ceiling():
    config = BenchConfig(hang_floor_s=15.0, hang_factor=20.0, hang_ceiling_s=120.0, correctness_trials=5,
                         warmup_trials=5, timed_trials=100)
    n = len(schedule(config, []))
    assert n == 111 and schedule(config, [])[-1] == "check" and schedule(config, [])[5:10] == ["warmup"] * 5
    assert trial_limit_s(0.01, n, config) == pytest.approx(15.0 + 20 * 0.01e-3 * n)
    assert trial_limit_s(10.0, n, config) == pytest.approx(15.0 + 20 * 1.11)
    assert trial_limit_s(1000.0, n, config) == 120.0


def test_chunks_hold_what_the_reference_keeps_within_chunk_bytes():
    kinds = schedule(BenchConfig(correctness_trials=5, warmup_trials=5, timed_trials=100), [])
    mib = 1 << 20
    # seeded: warm-up and timed calls keep only sampled values in host memory, so they share one chunk with the
    # checked calls around them; a checked call keeps inputs and outputs (2 x 256 MiB here: two per GiB)
    plan = chunk_plan(kinds, True, 256 * mib, 256 * mib, 1024 * mib)
    assert plan == {0: 2, 2: 2, 4: 107}
    # through the region every call keeps its inputs: 4 per GiB once the checked calls are done
    plan = chunk_plan(kinds, False, 256 * mib, 256 * mib, 1024 * mib)
    assert list(plan.items())[:4] == [(0, 2), (2, 2), (4, 3), (7, 4)] and len(plan) == 4 + 26
    for seeded in (True, False):
        for size in (1, 100 * mib, 5000 * mib):  # every call in exactly one chunk, even one larger than the bound
            plan = chunk_plan(kinds, seeded, size, size, 1024 * mib)
            covered = [i for start, n in plan.items() for i in range(start, start + n)]
            assert covered == list(range(len(kinds))) and all(n >= 1 for n in plan.values())
    assert chunk_plan(kinds, True, mib, mib, 1024 * mib) == {0: 111}


def test_make_verdict_uses_the_reason_as_feedback_and_trims_it():
    v = make_verdict("p2", Status.COMPILE_ERROR, "r" * 1000, CONFIG, ISOLATION, feedback="")
    assert v.feedback != v.reason and len(v.feedback) < 1000 and "[... trimmed ...]" in v.feedback
    v = make_verdict("p2", Status.FORBIDDEN, "why", CONFIG, ISOLATION, rule="pass", feedback="all of it")
    assert (v.reason, v.feedback, v.rule, v.backend, v.isolation) == ("why", "all of it", "pass", "cpu", ISOLATION)
    assert Verdict.from_json(v.to_json()) == v


def test_hidden_time_is_measured_against_the_calibration_and_a_gross_gap_is_suspect():
    from kevin_exp.bench.verdict import hidden_time_ms

    # calls cost 2 ms around the reported time before the candidate loaded, 2.3 ms after: 0.3 ms hidden
    assert hidden_time_ms([1.0, 1.0], [3.3, 3.3], [0.1, 0.1], [2.1, 2.1]) == pytest.approx(0.3)
    assert hidden_time_ms([1.0, 1.0], [3.3, 9.0], [0.1, 0.1], [2.1, 7.0]) == pytest.approx(0.3)  # least of each
    assert hidden_time_ms([1.0], [3.0], [], []) == 0.0
    lying = outcome(new_ms=[1.0] * 3, ref_ms=[8.0] * 3, outside_ms=[5.0] * 3, calibration_ms=[0.1] * 3,
                    calibration_outside_ms=[2.1] * 3)  # 2 ms more than the path costs: the runner hid it
    v = judge(lying)  # on by default: 2 ms hidden > 0.5 x 1 ms + 1 ms
    assert v.status is Status.SUSPECT and v.rule == "hidden_time" and "more (parent's clock)" in v.reason
    assert v.extra["hidden_ms"] == pytest.approx(2.0)
    v = judge(lying, BenchConfig(hidden_time_check=False))
    assert v.status is Status.OK and v.extra["hidden_ms"] == pytest.approx(2.0)


def test_a_run_flagged_for_hidden_time_is_measured_again_and_suspect_only_when_flagged_every_time():
    calibration = dict(calibration_ms=[0.1] * 3, calibration_outside_ms=[2.1] * 3)
    flagged = judge(outcome(new_ms=[1.0] * 3, ref_ms=[8.0] * 3, outside_ms=[5.0] * 3, **calibration))
    clean = judge(outcome(new_ms=[1.0] * 3, ref_ms=[8.0] * 3, outside_ms=[3.0] * 3, **calibration))
    assert flagged.rule == "hidden_time" and clean.status is Status.OK
    once = BenchConfig(hidden_time_retries=1)
    assert needs_remeasure(flagged, 1, once) and not needs_remeasure(flagged, 2, once)
    assert not needs_remeasure(flagged, 1, BenchConfig(hidden_time_retries=0)) and not needs_remeasure(clean, 1, once)
    # noise on one measurement: the clean second one stands, the flagged one recorded
    v = apply_remeasure(flagged, clean)
    assert v.status is Status.OK and v.speedup == pytest.approx(8.0)
    assert [r["hidden_ms"] for r in v.extra["remeasured"]] == [pytest.approx(2.0)]
    # a lie repeats: flagged twice is suspect, both earlier measurements kept
    again = judge(outcome(new_ms=[1.0] * 3, ref_ms=[8.0] * 3, outside_ms=[5.5] * 3, **calibration))
    third = judge(outcome(new_ms=[1.0] * 3, ref_ms=[8.0] * 3, outside_ms=[6.0] * 3, **calibration))
    v = apply_remeasure(apply_remeasure(flagged, again), third)
    assert v.status is Status.SUSPECT and v.rule == "hidden_time"
    assert [r["hidden_ms"] for r in v.extra["remeasured"]] == [pytest.approx(2.0), pytest.approx(2.5)]
    with pytest.raises(ValueError, match="hidden_time_retries"):
        BenchConfig(hidden_time_retries=-1)


def test_hidden_time_under_load_that_came_after_the_calibration_is_not_a_lie_but_gains_nothing():
    """Some task waited for a CPU during 30% of the calibration and 95% of the trials: the load came later and
    stretched the trials' path, so the same 2 ms extra is not accused. The run is measured again, and its
    speedup is the outside clock's bound, as a lying runner's would be."""
    lie = dict(new_ms=[1.0] * 3, ref_ms=[8.0] * 3, outside_ms=[5.0] * 3, calibration_ms=[0.1] * 3,
               calibration_outside_ms=[2.1] * 3)
    loaded = judge(outcome(contention={"calibration": 0.3, "trials": 0.95}, **lie))
    assert loaded.status is Status.OK and loaded.rule is None
    assert loaded.extra["hidden_time_inconclusive"] == {"hidden_ms": pytest.approx(2.0), "allowed_ms": pytest.approx(1.5)}
    assert loaded.extra["contention"] == {"calibration": 0.3, "trials": 0.95}
    assert loaded.extra["timing"]["used"] == "outside_bound" and loaded.runtime_ms == pytest.approx(2.95)
    assert needs_remeasure(loaded, 1, BenchConfig(hidden_time_retries=1))
    # the load the same at both (however high), risen by no more than the margin, or not known: accused
    for contention in ({"calibration": 0.97, "trials": 0.99}, {"calibration": 0.3, "trials": 0.39},
                       {"calibration": None, "trials": 0.95}, {}):
        v = judge(outcome(contention=contention, **lie))
        assert v.status is Status.SUSPECT and v.rule == "hidden_time", contention
    # a stricter margin accuses under the same load; a margin outside [0, 1] is refused
    strict = judge(outcome(contention={"calibration": 0.3, "trials": 0.95}, **lie), BenchConfig(hidden_time_contention=0.7))
    assert strict.status is Status.SUSPECT
    with pytest.raises(ValueError, match="hidden_time_contention"):
        BenchConfig(hidden_time_contention=1.5)


def test_the_time_used_is_the_reported_one_or_the_outside_bound_whichever_is_longer():
    from kevin_exp.bench.verdict import timing_bound

    # the gap alone is not suspect here; the median of the reported times is the figure
    config = BenchConfig(hidden_time_slack_ms=0.05, hidden_time_suspect_ms=5.0, timing_statistic="median")
    calibration = dict(calibration_ms=[0.1, 0.1, 0.1], calibration_outside_ms=[2.1, 2.3, 6.0])  # path: 2 ms at least
    # under-reported: 1 ms reported, but the parent's clock saw at least 5 ms, 2 ms of it the path: >= 2.95 ms
    lying = judge(outcome(new_ms=[1.0, 1.0, 1.0], ref_ms=[8.0] * 3, outside_ms=[5.2, 5.0, 7.0], **calibration), config)
    assert lying.status is Status.OK and lying.runtime_ms == pytest.approx(2.95)
    assert lying.speedup == pytest.approx(8.0 / 2.95) and lying.runtime_stats.median_ms == 1.0
    assert lying.extra["timing"] == {"statistic": "median", "reported_ms": 1.0, "outside_ms": 5.2, "calibration_overhead_ms": 2.0,
                                     "outside_bound_ms": 2.95, "used_ms": 2.95, "slack_ms": 0.05, "used": "outside_bound"}
    assert "outside clock" in lying.reason
    # honest, outside clock disturbed on most calls: the least outside time is the quiet one, the reported time stands
    honest = judge(outcome(new_ms=[3.0, 3.1, 2.9], ref_ms=[8.0] * 3, outside_ms=[9.0, 4.95, 7.5], **calibration), config)
    assert honest.status is Status.OK and honest.runtime_ms == 3.0 and honest.extra["timing"]["used"] == "reported"
    assert honest.speedup == pytest.approx(8.0 / 3.0)
    # a lie gains at most the slack: reported ~0, true 3 ms
    assert timing_bound([0.001] * 3, [5.0] * 3, [0.1] * 3, [2.1] * 3, 0.05).outside_bound_ms == pytest.approx(2.95)
    # no calibration calls: no bound, the reported time is used
    assert timing_bound([1.0], [5.0], [], [], 0.05).outside_bound_ms is None
    assert judge(ok_outcome(ref_ms=4.0, new_ms=2.0, outside_ms=9.0)).runtime_ms == 2.0


def test_a_recheck_rebases_the_first_speedup_on_the_re_timed_reference():
    config = BenchConfig(recheck_speedup=5.0, recheck_tolerance=1.5)
    first = judge(ok_outcome(ref_ms=80.0, new_ms=1.0), config)  # the cached reference time was disturbed: 80 ms
    second = judge(ok_outcome(ref_ms=40.0, new_ms=1.1), config)  # re-timed: 40 ms
    v = apply_recheck(first, second, config)
    assert v.status is Status.OK and v.ref_runtime_ms == 40.0 and v.speedup == pytest.approx(40.0)
    assert v.extra["recheck"]["first"]["speedup"] == 80.0 and "re-timed for the recheck" in v.reason
