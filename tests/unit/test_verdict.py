"""The verdict on a run, built from the worker's raw outcome alone: no worker, no compile, no I/O."""
from __future__ import annotations

import pytest

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.verdict import (
    Status,
    TimingStats,
    Verdict,
    make_verdict,
    verdict_from_run,
)
from kevin_exp.bench.worker_process import WorkerOutcome

CONFIG = BenchConfig(feedback_chars=400, excessive_speedup=10.0, run_timeout_s=30.0, memory_limit_gb=4.0)
ISOLATION = "process(new session, rlimits)"


def stats(median_ms: float) -> dict:
    return {"median_ms": median_ms, "mean_ms": median_ms, "std_ms": 0.0, "min_ms": median_ms,
            "max_ms": median_ms, "p25_ms": median_ms, "p75_ms": median_ms, "trials": 100}


def outcome(result: dict | None = None, returncode: int | None = 0, output_tail: str = "", **kw) -> WorkerOutcome:
    fields = dict(timed_out=False, memory_exceeded=False, output_bytes=len(output_tail), seconds=1.0)
    fields.update(kw)
    return WorkerOutcome(result=result, returncode=returncode, output_tail=output_tail, **fields)


def ok_result(ref_ms: float, new_ms: float) -> dict:
    return {
        "status": "ok", "device": "cpu: test", "phases": {"load_s": 0.1},
        "correctness_trials": 5, "max_abs_diff": 1e-6, "atol": 1e-2, "rtol": 1e-2,
        "runtime_stats": stats(new_ms), "ref_runtime_stats": stats(ref_ms),
    }


def judge(o: WorkerOutcome, config: BenchConfig = CONFIG) -> Verdict:
    return verdict_from_run("p1", o, config, isolation=ISOLATION, compile_s=2.5, run_s=1.25, cache_hit=True)


def test_ok_carries_the_speedup_timings_and_the_run_record():
    v = judge(outcome(ok_result(ref_ms=4.0, new_ms=2.0)))
    assert v.status is Status.OK and v.correct and v.rule is None
    assert v.speedup == pytest.approx(2.0) and not v.excessive_speedup
    assert (v.runtime_ms, v.ref_runtime_ms) == (2.0, 4.0)
    assert v.runtime_stats == TimingStats(**stats(2.0)) and v.ref_runtime_stats == TimingStats(**stats(4.0))
    assert v.reason == "correct; speedup 2x over PyTorch eager (4 ms -> 2 ms)" == v.feedback
    assert (v.correctness_trials, v.max_abs_diff, v.atol, v.rtol) == (5, 1e-6, 1e-2, 1e-2)
    assert v.extra == {"phases": {"load_s": 0.1}}
    assert (v.problem_id, v.device, v.backend, v.isolation) == ("p1", "cpu: test", "cpu", ISOLATION)
    assert (v.compile_s, v.run_s, v.cache_hit) == (2.5, 1.25, True)


@pytest.mark.parametrize("ref_ms, new_ms, flagged", [(10.0, 1.0, False), (10.5, 1.0, True), (1.0, 0.0, True)])
def test_a_speedup_above_the_threshold_is_flagged_but_still_ok(ref_ms, new_ms, flagged):
    v = judge(outcome(ok_result(ref_ms, new_ms)))
    assert v.status is Status.OK and v.correct
    assert v.excessive_speedup is flagged
    assert ("flagged: speedup above 10x" in v.reason) is flagged
    if new_ms == 0.0:
        assert v.speedup == float("inf")


def test_incorrect_keeps_the_workers_reason_and_no_timings():
    result = {"status": "incorrect", "reason": "trial 1/5: output mismatch", "rule": None, "detail": "ignored",
              "device": "cpu: test", "correctness_trials": 5}
    v = judge(outcome(result))
    assert v.status is Status.INCORRECT and not v.correct
    assert v.reason == v.feedback == "trial 1/5: output mismatch"
    assert v.speedup is None and v.runtime_stats is None and not v.excessive_speedup
    assert v.correctness_trials == 5 and v.device == "cpu: test"


def test_a_runtime_error_adds_the_traceback_to_the_feedback():
    result = {"status": "runtime_error", "reason": "your forward raised: ValueError: x", "rule": None,
              "detail": "Traceback ...\nValueError: x"}
    v = judge(outcome(result))
    assert v.status is Status.RUNTIME_ERROR
    assert v.reason == "your forward raised: ValueError: x"
    assert v.feedback == "your forward raised: ValueError: x\nTraceback ...\nValueError: x"


def test_a_runtime_rule_reported_by_the_worker_is_forbidden_with_its_rule():
    result = {"status": "forbidden", "reason": "forward called the PyTorch op mm", "rule": "runtime_torch_op",
              "detail": ""}
    v = judge(outcome(result))
    assert v.status is Status.FORBIDDEN and v.rule == "runtime_torch_op" and not v.correct


def test_a_forged_result_is_forbidden_whatever_it_claims():
    v = judge(outcome(ok_result(ref_ms=100.0, new_ms=1.0), forged=True, timed_out=True))
    assert v.status is Status.FORBIDDEN and v.rule == "result_forged"
    assert not v.correct and v.speedup is None
    assert "forged" in v.reason and v.device == "cpu: test"


def test_timeout_and_memory_limit():
    v = judge(outcome(None, returncode=-9, timed_out=True))
    assert v.status is Status.TIMEOUT and v.reason.startswith("the run exceeded its 30 s limit")
    v = judge(outcome(None, returncode=-9, memory_exceeded=True))
    assert v.status is Status.CRASHED and v.reason == "the run exceeded the 4 GB memory limit"


@pytest.mark.parametrize("returncode, tail, result, how", [
    (-11, "Fatal Python error: Segmentation fault", None, "killed by SIGSEGV"),
    (128 + 9, "", None, "killed by SIGKILL"),  # unshare reports a killed child as 128 + signal
    (1, "unshare: sigprocmask unblock failed", None, "killed by SIGKILL"),
    (3, "", None, "exited with code 3"),
    (3, "", {"worker_error": "sandbox setup failed: mount"}, "sandbox setup failed: mount"),
])
def test_an_exit_without_a_result_is_a_crash_that_says_how(returncode, tail, result, how):
    v = judge(outcome(result, returncode=returncode, output_tail=tail))
    assert v.status is Status.CRASHED and not v.correct
    assert v.reason == f"the process running your code {how} before reporting a result"
    assert v.feedback == v.reason + (f"\n{tail}" if tail else "")


def test_a_cuda_error_is_named_and_long_output_is_trimmed():
    tail = "x" * 5000 + "\nCUDA error: an illegal memory access was encountered"
    v = judge(outcome(None, returncode=-6, output_tail=tail))
    assert v.status is Status.CRASHED and v.reason.endswith("(CUDA error)")
    assert len(v.feedback) <= CONFIG.feedback_chars + len("\n[... trimmed ...]\n")
    assert v.feedback.startswith(v.reason)


def test_make_verdict_uses_the_reason_as_feedback_and_trims_it():
    v = make_verdict("p2", Status.COMPILE_ERROR, "r" * 1000, CONFIG, ISOLATION, feedback="")
    assert v.feedback != v.reason and len(v.feedback) < 1000 and "[... trimmed ...]" in v.feedback
    v = make_verdict("p2", Status.FORBIDDEN, "why", CONFIG, ISOLATION, rule="pass", feedback="all of it")
    assert (v.reason, v.feedback, v.rule, v.backend, v.isolation) == ("why", "all of it", "pass", "cpu", ISOLATION)
    assert Verdict.from_json(v.to_json()) == v
