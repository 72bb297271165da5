"""The result of evaluating one (problem, candidate) pair, and how it is built: pure functions, no I/O.

``verdict_from_run`` turns what a run left behind (``run_outcome.RunOutcome``) into a verdict,
``apply_recheck`` settles a too-good speedup against its re-timing; the evaluator's earlier stages
(format, static rules, compiles) use ``make_verdict`` directly.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from kevin_exp.bench import hidden_checks
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.messages import trim
from kevin_exp.bench.physical_floor import below_floor

if TYPE_CHECKING:
    from kevin_exp.bench.run_outcome import RunOutcome


class Status(str, Enum):
    OK = "ok"
    FORMAT_ERROR = "format_error"
    FORBIDDEN = "forbidden"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    # correct, but its timing did not hold up (re-timed elsewhere, or inconsistent with the outside clock): scores 0
    SUSPECT = "suspect"
    # the evaluator failed for its own reasons (a build timed out under load, a compiler was killed, a tool or the
    # sandbox failed), twice: scores 0, and is not the candidate's mistake
    INFRA_ERROR = "infra_error"


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

    def statistic(self, name: str) -> float:
        """The figure a speedup is taken from (``BenchConfig.timing_statistic``): ``min`` or ``median``."""
        return {"min": self.min_ms, "median": self.median_ms}[name]


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
    # the runner's timed calls as the parent measured them from outside (they contain the reported times)
    outside_runtime_ms: float | None = None
    excessive_speedup: bool = False
    # the trial phase's deadline this run had (scaled from the reference's time)
    time_limit_s: float | None = None
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


def verdict_from_run(problem_id: str, outcome: RunOutcome, config: BenchConfig, *, isolation: str,
                     compile_s: float, run_s: float, cache_hit: bool) -> Verdict:
    """The verdict on one run, from what the parent saw of it: the reference process's failure, the runner's
    end (wall clock, memory, exit), the status a check or the runner's refusal decided, else ``ok`` with the
    candidate's time over the reference's (the trusted process's), and ``suspect`` when a reported time is
    longer than the parent's outside measure of the same call or far shorter than it (``hidden_time_check``).
    The candidate's time is the larger of its runner's reports (their ``timing_statistic``: min or median, the
    reference's taken the same way) and the outside bound (``timing_bound``); both are in ``extra["timing"]``."""
    extra: dict[str, Any] = {"limits": outcome.limits, "phases": outcome.phases, "checked_calls": outcome.checked_calls,
                             "inputs": outcome.inputs, "exchange": outcome.exchange,
                             "run_cores": outcome.cores}
    if outcome.ref_ms:
        extra["ref_timing_cached"] = outcome.ref_cached
        extra["reference"] = outcome.reference  # the reference timing the speedup divides by: value, how, spread
    if outcome.hidden:
        extra["hidden_checks"] = outcome.hidden
    common: dict[str, Any] = dict(compile_s=compile_s, run_s=run_s, cache_hit=cache_hit, device=outcome.device,
                                  time_limit_s=outcome.limits.get("trials_s"), extra=extra)

    def verdict(status: Status, reason: str, rule: str | None = None, feedback: str = "", **kw: Any) -> Verdict:
        return make_verdict(problem_id, status, reason, config, isolation, rule=rule, feedback=feedback, **common, **kw)

    if outcome.status == "reference_failed":
        return verdict(Status.CRASHED, f"evaluator error: {outcome.reason}", feedback=outcome.reason)
    if outcome.hidden.get("during") and outcome.status == "incorrect" and not outcome.hidden.get("failed"):
        # the runner refused a hidden call's output itself (its shape, its kind): a failed hidden check, and its
        # reason (which may name the hidden size) stays in the record
        outcome.hidden["failed"] = {"check": outcome.hidden["during"], "call": outcome.trial, "reason": outcome.reason}
        outcome.reason = hidden_checks.FEEDBACK
    if outcome.hidden.get("during") and outcome.status not in ("ok", "incorrect", "forbidden"):
        # ended (crash, hang) or raised during a hidden check: what it printed or raised may show the call's inputs
        status = Status.TIMEOUT if outcome.ended is not None and outcome.ended.how == "timeout" else \
            Status.RUNTIME_ERROR if outcome.status == "runtime_error" else Status.CRASHED
        reason = f"{status.value} {hidden_checks.DURING}: {outcome.reason or (outcome.ended.how if outcome.ended else '')}"
        feedback = {Status.TIMEOUT: "the run exceeded its time limit", Status.RUNTIME_ERROR: "your forward raised"}.get(
            status, "the process running your code died") + " " + hidden_checks.DURING
        return verdict(status, reason, rule=outcome.rule, feedback=feedback)
    if outcome.ended is not None:
        how = outcome.ended.how
        if how == "timeout":
            limit = outcome.limits.get("load_s" if outcome.phase == "load" else "trials_s", config.hang_ceiling_s)
            during = {"load": "loading your module / constructing ModelNew", "trials": f"call {(outcome.trial or 0) + 1}",
                      "end": "the end of the run"}.get(outcome.phase, outcome.phase)
            return verdict(Status.TIMEOUT, f"the run exceeded its {limit:.3g} s limit during {during} (infinite loop or "
                           "deadlock?)")
        if how == "memory":
            return verdict(Status.CRASHED, f"the run exceeded the {config.memory_limit_gb:g} GB memory limit")
        sig = outcome.signal
        how_text = f"killed by {sig}" if sig else f"exited with code {outcome.returncode}"
        tail = trim(outcome.output_tail, config.feedback_chars // 2)
        reason = f"the process running your code {how_text} before reporting a result"
        if "CUDA error" in outcome.output_tail or "illegal memory access" in outcome.output_tail:
            reason += " (CUDA error)"
        return verdict(Status.CRASHED, reason, feedback=reason + ("\n" + tail if tail else ""))
    checked = dict(correctness_trials=outcome.correctness_trials, max_abs_diff=outcome.max_abs_diff)
    tol = config.tolerance_for("float32")
    checked.update(atol=tol.atol, rtol=tol.rtol)
    if outcome.status != "ok":
        try:
            status = Status(outcome.status)
        except ValueError:
            status = Status.CRASHED
        feedback = outcome.reason
        if outcome.detail and status is Status.RUNTIME_ERROR:
            feedback += "\n" + outcome.detail
        return verdict(status, outcome.reason, rule=outcome.rule, feedback=feedback, **checked)
    new = TimingStats.from_samples(outcome.new_ms)
    ref = TimingStats.from_samples(outcome.ref_ms)
    outside = TimingStats.from_samples(outcome.outside_ms)
    bound = timing_bound(outcome.new_ms, outcome.outside_ms, outcome.calibration_ms, outcome.calibration_outside_ms,
                         config.hidden_time_slack_ms)
    stat = config.timing_statistic
    reported_ms, ref_ms, outside_ms = new.statistic(stat), ref.statistic(stat), outside.statistic(stat)
    used_ms = max(reported_ms, bound.outside_bound_ms) if bound.outside_bound_ms is not None else reported_ms
    extra["timing"] = {"statistic": stat, "reported_ms": round(reported_ms, 6), "outside_ms": round(outside_ms, 6),
                       "calibration_overhead_ms": bound.overhead_ms, "outside_bound_ms": bound.outside_bound_ms,
                       "used_ms": round(used_ms, 6), "slack_ms": config.hidden_time_slack_ms,
                       "used": "outside_bound" if used_ms > reported_ms else "reported"}
    speedup = ref_ms / used_ms if used_ms > 0 else float("inf")
    flagged = speedup > config.excessive_speedup
    timing = dict(runtime_ms=used_ms, ref_runtime_ms=ref_ms, speedup=speedup, runtime_stats=new,
                  ref_runtime_stats=ref, outside_runtime_ms=outside_ms, excessive_speedup=flagged)
    hidden = hidden_time_ms(outcome.new_ms, outcome.outside_ms, outcome.calibration_ms, outcome.calibration_outside_ms)
    extra["hidden_ms"] = round(hidden, 4)
    extra["contention"] = dict(outcome.contention)
    allowed = config.hidden_time_factor * new.median_ms + config.hidden_time_suspect_ms
    if config.hidden_time_check and hidden > allowed and contention_rose(outcome.contention, config):
        # not accused: the load stretched the path; the speedup above already takes the outside clock's bound
        extra["hidden_time_inconclusive"] = {"hidden_ms": round(hidden, 4), "allowed_ms": round(allowed, 4)}
    elif config.hidden_time_check and hidden > allowed:
        reason = (f"suspect: each timed call took {hidden:.3g} ms more (parent's clock) than the runner reported "
                  f"({new.median_ms:.3g} ms), beyond what the same path costs without your code (allowed "
                  f"{allowed:.3g} ms); the run counts for nothing")
        return verdict(Status.SUSPECT, reason, rule="hidden_time", **checked, **timing)
    impossible = reported_exceeds_outside(outcome.new_ms, outcome.outside_ms)
    if impossible:
        k = impossible[0]
        reason = (f"suspect: timed call {k + 1} reported {outcome.new_ms[k]:.4g} ms, longer than the "
                  f"{outcome.outside_ms[k]:.4g} ms the evaluator measured from outside; the run counts for nothing")
        extra["impossible_calls"] = impossible[:20]
        return verdict(Status.SUSPECT, reason, rule="timing_inconsistent", **checked, **timing)
    if outcome.floor is not None:
        extra["floor"] = {**outcome.floor, "runtime_ms": round(used_ms, 6)}
        if below_floor(outcome.floor, used_ms):
            reason = (f"suspect: {used_ms:.4g} ms is below the problem's physical floor of {outcome.floor['floor_ms']:.4g} ms "
                      f"(its {outcome.floor['bytes_beyond_cache']} bytes beyond the caches at "
                      f"{outcome.floor['bandwidth_gbs']:g} GB/s x {outcome.floor['margin']:g}"
                      + (", or its FLOPs at the device's peak" if outcome.floor.get("flops_floor_ms") else "")
                      + "): no kernel is that fast; the run counts for nothing")
            return verdict(Status.SUSPECT, reason, rule="below_physical_floor", **checked, **timing)
    reason = (f"correct; speedup {speedup:.3g}x over PyTorch eager ({ref_ms:.4g} ms -> {used_ms:.4g} ms, "
              f"{stat} of {new.trials} timed calls")
    reason += "; the evaluator's outside clock, as the reported time was shorter)" if used_ms > reported_ms else ")"
    if flagged:
        reason += f"; flagged: speedup above {config.excessive_speedup:g}x"
    return verdict(Status.OK, reason, correct=True, **checked, **timing)


@dataclass(frozen=True)
class TimingBound:
    overhead_ms: float | None  # least (outside - reported) of the calibration calls: the path's own cost
    outside_bound_ms: float | None  # least outside time - overhead - slack: the least a call can have taken


def timing_bound(reported_ms: list[float], outside_ms: list[float], calibration_ms: list[float],
                 calibration_outside_ms: list[float], slack_ms: float) -> TimingBound:
    """The least the candidate's timed calls can have taken by the parent's clock: its shortest outside time less
    the least overhead the same phases showed with a stand-in before any candidate code was loaded, less
    ``slack_ms``. The time used for the speedup is the larger of this and the median reported time, so a
    runner that under-reports gains at most ``slack_ms`` per call (plus the spread between its median and its
    fastest call). Least values, not medians or per-call bounds: the noise on the outside clock (scheduling,
    pipes) only ever adds, so the least of each is the quietest measure of both, and the two noises cancel; a
    median moves with every disturbance of half the calls, and a per-call maximum adds each disturbed call's
    noise to an honest kernel's time. Without calibration calls there is no bound (None)."""
    if not calibration_ms or not reported_ms or not outside_ms:
        return TimingBound(None, None)
    overhead = min(o - r for r, o in zip(calibration_ms, calibration_outside_ms))
    return TimingBound(round(overhead, 6), round(min(outside_ms) - overhead - slack_ms, 6))


def reported_exceeds_outside(reported_ms: list[float], outside_ms: list[float]) -> list[int]:
    """Indices of timed calls whose reported time is longer than the parent's wall-clock measure of the same
    call (which contains it): impossible for an honest runner."""
    return [k for k, (r, o) in enumerate(zip(reported_ms, outside_ms)) if r > o]


def hidden_time_ms(reported_ms: list[float], outside_ms: list[float], calibration_ms: list[float],
                   calibration_outside_ms: list[float]) -> float:
    """How much more of each timed call the parent saw than the runner reported, beyond the same for the
    calibration calls made before any candidate code was loaded (least values of each, as in ``timing_bound``).
    An honest runner's extra is the path around the call (messages, the timer), the same in both: about 0; a
    runner that under-reports its own time shows the part it hid."""
    if not calibration_ms or not reported_ms:
        return 0.0
    candidate = min(o - r for r, o in zip(reported_ms, outside_ms))
    baseline = min(o - r for r, o in zip(calibration_ms, calibration_outside_ms))
    return candidate - baseline


def rechecks_disagree(first_speedup: float, second_speedup: float, tolerance: float) -> bool:
    """Whether two measurements of one candidate's speedup differ by more than the factor ``tolerance``."""
    lo, hi = sorted((first_speedup, second_speedup))
    if lo <= 0:
        return True
    return hi / lo > tolerance


def contention_rose(contention: dict[str, float | None], config: BenchConfig) -> bool:
    """Whether some task waited for a CPU during a larger share of the trials than of the calibration calls, by
    more than ``hidden_time_contention``: load that came after the calibration stretched the trials' path, and
    more hidden time than the calibration showed is no proof of a lie. Unknown (no pressure information): False."""
    calibration, trials = contention.get("calibration"), contention.get("trials")
    if calibration is None or trials is None:
        return False
    return trials - calibration > config.hidden_time_contention


def needs_remeasure(verdict: Verdict, attempts: int, config: BenchConfig) -> bool:
    """Whether a run the hidden-time check flagged, or could not judge for the load (after ``attempts`` runs),
    is measured again."""
    flagged = verdict.rule == "hidden_time" or "hidden_time_inconclusive" in verdict.extra
    return flagged and attempts <= config.hidden_time_retries


def apply_remeasure(first: Verdict, second: Verdict) -> Verdict:
    """The verdict after a run flagged by the hidden-time check was measured again in a fresh runner: the new
    run's verdict (flagged again, it stays ``suspect``), with every earlier flagged run in ``extra["remeasured"]``."""
    earlier = first.extra.pop("remeasured", [])
    record = {"reason": first.reason, "hidden_ms": first.extra.get("hidden_ms"), "timing": first.extra.get("timing")}
    second.extra["remeasured"] = earlier + [record]
    return second


def needs_recheck(verdict: Verdict, config: BenchConfig) -> bool:
    return verdict.status is Status.OK and verdict.speedup is not None and verdict.speedup > config.recheck_speedup


def apply_recheck(first: Verdict, second: Verdict, config: BenchConfig) -> Verdict:
    """The verdict after a too-good speedup was re-timed in a fresh runner on fresh inputs (and the reference
    timed again): the recheck's own failure if it failed, ``suspect`` (scores 0) if the two speedups disagree,
    else the first verdict; both timings go into ``extra["recheck"]``, each with the reference timing it used. Both
    speedups are taken over the recheck's reference time (the cached one unless re-measuring settled otherwise:
    ``reference_timing.settle``)."""
    record = {"first": _timing_record(first), "second": _timing_record(second), "tolerance": config.recheck_tolerance,
              "threshold": config.recheck_speedup}
    if second.ref_runtime_ms and first.runtime_ms and second.ref_runtime_ms != first.ref_runtime_ms:
        first.ref_runtime_ms, first.ref_runtime_stats = second.ref_runtime_ms, second.ref_runtime_stats
        if "reference" in second.extra:
            first.extra["reference"] = second.extra["reference"]
        first.speedup = first.ref_runtime_ms / first.runtime_ms
        first.excessive_speedup = first.speedup > config.excessive_speedup
        first.reason = (f"correct; speedup {first.speedup:.3g}x over PyTorch eager ({first.ref_runtime_ms:.4g} ms -> "
                        f"{first.runtime_ms:.4g} ms; the reference re-timed for the recheck)")
        first.feedback = trim(first.reason, config.feedback_chars)
    if second.status is not Status.OK:
        second.extra["recheck"] = record
        second.reason = f"recheck after a {first.speedup:.3g}x speedup: {second.reason}"
        second.feedback = trim(second.reason, config.feedback_chars)
        return second
    first.extra["recheck"] = record
    if rechecks_disagree(first.speedup, second.speedup, config.recheck_tolerance):
        first.status, first.correct = Status.SUSPECT, False
        first.rule = "recheck_disagrees"
        first.reason = (f"suspect: speedup {first.speedup:.3g}x, but {second.speedup:.3g}x when re-timed in a fresh "
                        f"process on fresh inputs (more than {config.recheck_tolerance:g}x apart); the run counts for nothing")
        first.feedback = trim(first.reason, config.feedback_chars)
    return first


def _timing_record(v: Verdict) -> dict[str, Any]:
    return {"status": v.status.value, "speedup": v.speedup, "runtime_ms": v.runtime_ms, "ref_runtime_ms": v.ref_runtime_ms,
            "outside_runtime_ms": v.outside_runtime_ms, "reference": v.extra.get("reference")}
