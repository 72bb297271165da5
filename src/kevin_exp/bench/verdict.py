"""The result of evaluating one (problem, candidate) pair, and how it is built: pure functions, no I/O.

``verdict_from_run`` turns what a run left behind (the worker's result, or how the worker ended) into a
verdict; the evaluator's earlier stages (format, static rules, compiles) use ``make_verdict`` directly.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.messages import trim

if TYPE_CHECKING:
    from kevin_exp.bench.worker_process import WorkerOutcome


class Status(str, Enum):
    OK = "ok"
    FORMAT_ERROR = "format_error"
    FORBIDDEN = "forbidden"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    CRASHED = "crashed"


@dataclass
class TimingStats:
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    p25_ms: float
    p75_ms: float
    trials: int

    @staticmethod
    def from_samples(samples_ms: list[float]) -> "TimingStats":
        import statistics

        s = sorted(samples_ms)
        n = len(s)
        q = statistics.quantiles(s, n=4) if n >= 2 else [s[0]] * 3
        return TimingStats(
            median_ms=statistics.median(s),
            mean_ms=statistics.fmean(s),
            std_ms=statistics.pstdev(s) if n > 1 else 0.0,
            min_ms=s[0],
            max_ms=s[-1],
            p25_ms=q[0],
            p75_ms=q[2],
            trials=n,
        )


@dataclass
class Verdict:
    """One candidate's verdict. ``feedback`` is trimmed to a size fit for a model's next prompt."""

    problem_id: str
    status: Status
    reason: str = ""
    correct: bool = False
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    runtime_stats: TimingStats | None = None
    ref_runtime_stats: TimingStats | None = None
    excessive_speedup: bool = False
    rule: str | None = None
    feedback: str = ""
    device: str = ""
    backend: str = ""
    atol: float | None = None
    rtol: float | None = None
    correctness_trials: int = 0
    max_abs_diff: float | None = None
    compile_s: float = 0.0
    run_s: float = 0.0
    cache_hit: bool = False
    isolation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Verdict":
        d = dict(d)
        d["status"] = Status(d["status"])
        for key in ("runtime_stats", "ref_runtime_stats"):
            if d.get(key) is not None:
                d[key] = TimingStats(**d[key])
        return Verdict(**d)


def make_verdict(problem_id: str, status: Status, reason: str, config: BenchConfig, isolation: str,
                 rule: str | None = None, feedback: str = "", **fields: Any) -> Verdict:
    """A verdict whose feedback (the reason when there is none) is trimmed for the model's next prompt."""
    return Verdict(
        problem_id=problem_id,
        status=status,
        reason=reason,
        rule=rule,
        feedback=trim(feedback or reason, config.feedback_chars),
        backend=config.backend,
        isolation=isolation,
        **fields,
    )


def verdict_from_run(problem_id: str, outcome: WorkerOutcome, config: BenchConfig, *, isolation: str,
                     compile_s: float, run_s: float, cache_hit: bool) -> Verdict:
    """The verdict on one run, from the worker's raw outcome. In order: a forged result, the wall clock, the
    memory limit, an exit without a result, then the status the worker reported; on ``ok`` the speedup over
    the reference, flagged above ``config.excessive_speedup``."""
    res = outcome.result or {}
    common: dict[str, Any] = dict(compile_s=compile_s, run_s=run_s, cache_hit=cache_hit, device=res.get("device", ""))

    def verdict(status: Status, reason: str, rule: str | None = None, feedback: str = "", **kw: Any) -> Verdict:
        return make_verdict(problem_id, status, reason, config, isolation, rule=rule, feedback=feedback, **common, **kw)

    if outcome.forged:
        return verdict(Status.FORBIDDEN, "something other than the evaluator wrote to the worker's result "
                       "channel (a forged result); the run counts for nothing", rule="result_forged")
    if outcome.timed_out:
        return verdict(Status.TIMEOUT, f"the run exceeded its {config.run_timeout_s:.0f} s limit (infinite loop or "
                       "deadlock?)")
    if outcome.memory_exceeded:
        return verdict(Status.CRASHED, f"the run exceeded the {config.memory_limit_gb:g} GB memory limit")
    if "status" not in res:
        sig = outcome.signal_name()
        how = f"killed by {sig}" if sig else f"exited with code {outcome.returncode}"
        if res.get("worker_error"):
            how = res["worker_error"]
        tail = trim(outcome.output_tail, config.feedback_chars // 2)
        reason = f"the process running your code {how} before reporting a result"
        if "CUDA error" in outcome.output_tail or "illegal memory access" in outcome.output_tail:
            reason += " (CUDA error)"
        return verdict(Status.CRASHED, reason, feedback=reason + ("\n" + tail if tail else ""))
    status = Status(res["status"])
    extra_fields = {k: res[k] for k in ("correctness_trials", "max_abs_diff", "atol", "rtol") if k in res}
    if res.get("phases"):
        # where the worker's time went (seconds per stage), for profiling the run stage
        extra_fields["extra"] = {"phases": res["phases"]}
    if status is not Status.OK:
        feedback = res.get("reason", "")
        if res.get("detail") and status is Status.RUNTIME_ERROR:
            feedback += "\n" + res["detail"]
        return verdict(status, res.get("reason", ""), rule=res.get("rule"), feedback=feedback, **extra_fields)
    new = TimingStats(**res["runtime_stats"])
    ref = TimingStats(**res["ref_runtime_stats"])
    speedup = ref.median_ms / new.median_ms if new.median_ms > 0 else float("inf")
    flagged = speedup > config.excessive_speedup
    reason = f"correct; speedup {speedup:.3g}x over PyTorch eager ({ref.median_ms:.4g} ms -> {new.median_ms:.4g} ms)"
    if flagged:
        reason += f"; flagged: speedup above {config.excessive_speedup:g}x"
    return verdict(
        Status.OK,
        reason,
        correct=True,
        runtime_ms=new.median_ms,
        ref_runtime_ms=ref.median_ms,
        speedup=speedup,
        runtime_stats=new,
        ref_runtime_stats=ref,
        excessive_speedup=flagged,
        **extra_fields,
    )
