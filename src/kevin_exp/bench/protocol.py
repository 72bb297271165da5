"""One candidate's run, driven by the parent in lockstep between the trusted reference process and the
candidate's runner (docs/hack_defences.md, "Where things run").

Schedule of calls, each on fresh inputs drawn from a secret per-evaluation seed and each checked by the
reference process, outputs and inputs: ``correctness_trials`` checked calls, ``warmup_trials``, ``timed_trials``
timed calls, then one more checked call drawn after all timing. The runner is told of a call only whether it
is timed: every call is staged the same way (allocator poisoned) and copies its whole output and its inputs as
it left them to the region. The reference process prepares inputs and expected outputs in chunks bounded by
bytes, only while the runner is idle; the runner sees one trial's inputs at a time. Every call has three phases
(stage, go, collect: ``_Calls``); the parent's own clock brackets "go", the call and the copies that make its
output final, and bounds the candidate's time from below (``verdict.timing_bound``). A call is checked before the
runner is sent anything more.
"""
from __future__ import annotations

import contextlib
import math
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

from kevin_exp.bench import hidden_checks
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.exchange import Layout, header_bytes, padded_bytes, seal_size
from kevin_exp.bench.physical_floor import floor_record
from kevin_exp.bench.reference_process import START_TIMEOUT_S, ReferenceFailed, ReferenceProcess, ReferenceTimings
from kevin_exp.bench.reference_timing import REFERENCE_TIMING_BLOCKS, Measurement, settle
from kevin_exp.bench.worker_process import Ended, WorkerProcess

REFERENCE_SLACK_S = 60.0  # a reference request's own limit, beyond the run's
CALIBRATION_CALLS = 20
# calls whose outputs and inputs are checked at sampled positions (host work); checked calls compare them whole
SAMPLED_KINDS = frozenset({"warmup", "timed"})
# what a runner may say about its own candidate; "ok" is never its to say
RUNNER_STATUSES = frozenset({"runtime_error", "forbidden", "format_error", "compile_error", "incorrect"})


@dataclass(frozen=True)
class RunJob:
    reference: str
    candidate: str
    prebuilt: dict[str, list[str]]


@dataclass
class RunOutcome:
    """What one run left behind; ``verdict.verdict_from_run`` turns it into a verdict."""

    status: str = "ok"  # ok | a verdict status the run decided (incorrect, forbidden, runtime_error, crashed, ...)
    reason: str = ""
    rule: str | None = None
    detail: str = ""
    needs_build: dict[str, Any] | None = None
    ended: Ended | None = None  # the runner stopped answering: how
    phase: str = ""  # where the run stopped: reference, load, trials, end
    trial: int | None = None
    output_tail: str = ""
    output_bytes: int = 0
    returncode: int | None = None
    signal: str | None = None
    device: str = ""
    new_ms: list[float] = field(default_factory=list)
    outside_ms: list[float] = field(default_factory=list)
    calibration_ms: list[float] = field(default_factory=list)
    calibration_outside_ms: list[float] = field(default_factory=list)
    ref_ms: list[float] = field(default_factory=list)
    ref_cached: bool = False
    reference: dict[str, Any] = field(default_factory=dict)  # the reference timing used (reference_timing.settle)
    max_abs_diff: float = 0.0
    checked_calls: int = 0
    correctness_trials: int = 0
    limits: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    inputs: str = ""  # how the runner got each call's inputs: seeded (drew them from the call's seed) | region
    cores: list[int] = field(default_factory=list)  # the run slot's own cores the run was on (empty: none reserved)
    hidden: dict[str, Any] = field(default_factory=dict)  # the hidden checks: asked, skipped, passed, failed (never fed back)
    floor: dict[str, Any] | None = None  # the problem's physical floor on this machine (physical_floor.floor_record)


def schedule(config: BenchConfig, hidden: list[str] | None = None) -> list[str]:
    """The kind of each call, in order: check | hidden:<name> | warmup | timed. The hidden checks (``hidden``: those
    that apply to the problem; None: all the settings ask for) come after the correctness trials, before timing."""
    names = hidden_checks.enabled(config) if hidden is None else hidden
    return (["check"] * config.correctness_trials + [hidden_checks.kind(n) for n in names] + ["warmup"] * config.warmup_trials
            + ["timed"] * config.timed_trials + ["check"])


def chunk_plan(kinds: list[str], seeded: bool, input_bytes: int, output_bytes: int, chunk_bytes: int) -> dict[int, int]:
    """Where each chunk starts, and how many calls it prepares: consecutive calls while what the reference keeps
    for them stays within ``chunk_bytes`` (at least one call per chunk). A checked call keeps its inputs and its
    whole expected output on the device; a sampled call keeps only the expected values at its sampled positions,
    in host memory, plus its inputs where they go through the region (seeded ones are drawn again by the
    runner). So seeded warm-up and timed calls need one chunk between them, not one every few calls: each chunk
    is a wait for the runner, and the call before it is collected and checked on its own first."""
    starts: dict[int, int] = {}
    start, kept = 0, 0
    for i, kind in enumerate(kinds):
        need = input_bytes if kind in SAMPLED_KINDS and not seeded else 0 if kind in SAMPLED_KINDS \
            else input_bytes + output_bytes
        if i > start and kept + need > chunk_bytes:
            starts[start] = i - start
            start, kept = i, 0
        kept += need
    if kinds:
        starts[start] = len(kinds) - start
    return starts


def trial_limit_s(ref_median_ms: float, n_calls: int, config: BenchConfig) -> float:
    """The trial phase's deadline: scales with the reference's time for the whole protocol, within [floor, ceiling]."""
    expected_s = ref_median_ms / 1e3 * n_calls
    return min(max(config.hang_floor_s + config.hang_factor * expected_s, config.hang_floor_s), config.hang_ceiling_s)


def reference_timing(ref: ReferenceProcess, timings: ReferenceTimings, source: str, prepared: dict[str, Any],
                     config: BenchConfig, quiet: Callable[[], None] = lambda: None,
                     refresh: bool = False) -> tuple[list[float], bool, dict[str, Any]]:
    """The reference's timed samples (their ``timing_statistic`` is the figure a speedup divides by), whether they
    are the cached ones, and the record of the timing for the verdict: from the cache, or measured now and cached
    when quiet; with ``refresh`` (a recheck) measured again and settled against the cached timing
    (``reference_timing.settle``). ``quiet`` runs before each measurement."""
    key = timings.key(source, config.backend, prepared["device"], prepared["torch"], config.warmup_trials,
                      config.timed_trials, config.timing_statistic)
    limit = config.hang_ceiling_s * 4 + REFERENCE_SLACK_S

    def measure() -> Measurement:
        quiet()
        blocks = []
        for _ in range(REFERENCE_TIMING_BLOCKS):
            reply = ref.call({"op": "time", "seed": secrets.randbits(63), "warmup": config.warmup_trials,
                              "trials": config.timed_trials}, limit)
            blocks.append([float(x) for x in reply["ms"]])
        return Measurement.from_blocks(blocks, config.timing_statistic)

    # on cpu every measurement shares the machine's cores: one at a time across the jobs sharing the cache; on cuda
    # each device has its own, and only the same reference is never measured twice at once
    lock = "cpu" if config.backend == "cpu" else key
    lock_wait = (config.hang_ceiling_s + REFERENCE_SLACK_S) * (1 + config.reference_retries)  # then measure anyway
    m, use, cached = settle(timings, key, measure, config, refresh, lock, lock_wait)
    return m.samples, cached, use


def time_reference_ahead(ref: ReferenceProcess, timings: ReferenceTimings, source: str, config: BenchConfig,
                         quiet: Callable[[], None] = lambda: None) -> None:
    """The reference's timing measured and cached before a run needs it (a slot does this while it waits for
    builds): the same measurement the problem's first run would make. Raises ``ReferenceFailed`` as a run would."""
    limit = config.hang_ceiling_s + REFERENCE_SLACK_S
    prepared = ref.call({"op": "prepare", "source": source, "init_seed": config.seed}, limit)
    reference_timing(ref, timings, source, prepared, config, quiet)  # (cached only when quiet)
    ref.call({"op": "release"}, limit)


def run_protocol(ref: ReferenceProcess, runner: WorkerProcess, exchange_fd: int, timings: ReferenceTimings, job: RunJob,
                 config: BenchConfig, seed: int | None = None, quiet: Callable[[], None] = lambda: None,
                 refresh_reference: bool = False,
                 device_quiet: Callable[[], ContextManager[float]] = lambda: contextlib.nullcontext(0.0)) -> RunOutcome:
    """``quiet`` is called before the reference is timed: it waits until nothing else the slot started is busy.
    ``device_quiet`` is held from calibration to the last call: while it is, nothing else the slot started uses
    the device (standby runners wait to start CUDA); it gives the seconds it waited for that."""
    outcome = RunOutcome()
    clock = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        outcome.phases[name] = round(now - clock[0], 4)
        clock[0] = now

    secret = secrets.randbits(63) if seed is None else seed  # never sent to the runner
    ref_limit = config.hang_ceiling_s + REFERENCE_SLACK_S
    try:
        prepared = ref.call({"op": "prepare", "source": job.reference, "init_seed": config.seed,
                             "hidden": hidden_checks.enabled(config), "floor": config.physical_floor}, ref_limit)
        outcome.device = prepared["device"]
        outcome.hidden = hidden_checks.new_record(config, prepared)
        if config.physical_floor:
            outcome.floor = floor_record(prepared.get("floor"), prepared["input"], prepared["output"], config.backend,
                                         config.floor_bandwidth_gbs, config.floor_margin)
        outcome.ref_ms, outcome.ref_cached, outcome.reference = reference_timing(
            ref, timings, job.reference, prepared, config, quiet, refresh_reference)
        hidden = prepared.get("hidden") or {}  # a hidden size's inputs and output may be larger
        in_bytes = max(padded_bytes(prepared["input"]), padded_bytes(prepared["init"]), int(hidden.get("input_bytes", 0)))
        out_bytes = max(padded_bytes(prepared["output"]), int(hidden.get("output_bytes", 0)))
        layout = Layout.for_sizes(in_bytes, out_bytes)
        lap("reference_s")
        seal_size(exchange_fd, layout.size)  # before any candidate code: the runner cannot grow or shrink it
        ref.attach_exchange(exchange_fd, ref_limit)
        lap("exchange_s")
    except ReferenceFailed as exc:
        return _reference_failed(outcome, exc)

    ready = runner.wait_ready(START_TIMEOUT_S)
    if not _answered(outcome, runner, ready, "start", "ready"):
        return outcome
    lap("runner_ready_s")  # waiting for a standby runner to finish starting
    with device_quiet() as waited:
        if waited:
            outcome.phases["device_quiet_wait_s"] = round(waited, 4)
        clock[0] = time.monotonic()
        seeded = bool(prepared.get("seeded"))
        outcome.inputs = "seeded" if seeded else "region"
        if seeded:
            runner.send({"op": "problem", "source": job.reference, "backend": config.backend})
            if not _answered(outcome, runner, runner.recv(time.monotonic() + config.load_timeout_s), "start", "problem_ready"):
                return outcome
        try:
            if not _calibrate(outcome, ref, runner, layout, prepared["output"], secret, ref_limit, config, seeded):
                return outcome
            init = ref.call({"op": "stage_init", "layout": layout.to_json()}, ref_limit)["inputs"]
        except ReferenceFailed as exc:
            return _reference_failed(outcome, exc)
        lap("calibrate_s")
        kinds = schedule(config, outcome.hidden["available"])
        outcome.limits = {"load_s": config.load_timeout_s,
                          "trials_s": round(trial_limit_s(statistics.median(outcome.ref_ms), len(kinds), config), 3)}
        rules = config.rules
        runner.send({"op": "load", "candidate": job.candidate, "prebuilt": job.prebuilt, "init": init, "seed": config.seed,
                     "layout": layout.to_json(), "output": prepared["output"],
                     "rules": {"runtime_block_torch_ops": rules.runtime_block_torch_ops,
                               "runtime_require_kernel_call": rules.runtime_require_kernel_call,
                               "no_timing_patch": rules.no_timing_patch, "framework_flags": rules.framework_flags}})
        reply = runner.recv(time.monotonic() + config.load_timeout_s)
        if not _answered(outcome, runner, reply, "load", "loaded"):
            return outcome
        lap("load_s")

        starts = chunk_plan(kinds, seeded, header_bytes(prepared["input"]), header_bytes(prepared["output"]),
                            config.chunk_bytes)
        calls = _Calls(outcome, ref, runner, layout, seeded, ref_limit, "trials", outcome.limits["trials_s"])
        busy_before, by_op_before = ref.busy_s, dict(ref.busy_by_op)
        checks = _TrialChecks(outcome, ref, runner, layout, config)
        try:
            for i, kind in enumerate(kinds):
                if i in starts:
                    if not calls.settle(checks):  # the chunk replaces the reference's trials: none may be unchecked
                        return outcome
                    calls.chunk(secret, i, kinds[i:i + starts[i]], ref_limit + config.hang_ceiling_s)
                # a run that ends during a hidden check is fed back without what the call was (verdict)
                outcome.hidden["during"] = hidden_checks.name_of(kind) if hidden_checks.is_hidden(kind) else None
                timed = kind == "timed"  # all the runner learns of a call's kind: it is checked like any other
                if not calls.run(i, kind, lambda staged: {"op": "trial", "i": i, **_inputs(staged), "timed": timed},
                                 checks):
                    return outcome
            if not calls.settle(checks):
                return outcome
            lap("trials_s")
            outcome.phases.update({k: round(v, 4) for k, v in calls.busy.items()})
            outcome.phases["trials_reference_busy_s"] = round(ref.busy_s - busy_before, 4)
            for op in ("chunk", "check"):
                outcome.phases[f"trials_reference_{op}_s"] = round(ref.busy_by_op.get(op, 0.0) - by_op_before.get(op, 0.0), 4)
            runner.send({"op": "end"})
            reply = runner.recv(time.monotonic() + max(5.0, calls.budget_s - calls.spent))
            if not _answered(outcome, runner, reply, "end", "ended"):
                return outcome
            ref.call({"op": "release"}, ref_limit)
            lap("end_s")
        except ReferenceFailed as exc:
            return _reference_failed(outcome, exc)
        return _finish(outcome, runner)


def _calibrate(outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout, output: dict[str, Any],
               secret: int, ref_limit: float, config: BenchConfig, seeded: bool) -> bool:
    """Before any candidate code is loaded, the runner makes ``CALIBRATION_CALLS`` timed calls through exactly
    the phases of a candidate's timed call (``_Calls``) with a stand-in that only fills an output of the
    expected shape: what the parent's clock sees of a call beyond its reported time when nothing under-reports
    (``verdict.timing_bound`` subtracts it from the candidate's outside time)."""
    calls = _Calls(outcome, ref, runner, layout, seeded, ref_limit, "start", config.load_timeout_s)
    calls.chunk(secret, -CALIBRATION_CALLS, ["timed"] * CALIBRATION_CALLS, ref_limit)
    record = _CalibrationRecord(outcome, ref, runner, layout, config)
    for i in range(-CALIBRATION_CALLS, 0):
        if not calls.run(i, "timed", lambda staged: {"op": "calibrate", "i": i, **_inputs(staged), "layout": layout.to_json(),
                                                     "output": output, "guard": config.rules.runtime_block_torch_ops},
                         record):
            return False
    if not calls.settle(record):
        return False
    outcome.phases.update({f"calibrate_{k}": round(v, 4) for k, v in calls.busy.items()})
    ref.call({"op": "release"}, ref_limit)
    return True


def _inputs(staged: dict[str, Any]) -> dict[str, Any]:
    """What the runner is told of a call's inputs: their seed (it draws them itself) or where they are."""
    told = {"seed": staged["seed"]} if "seed" in staged else {"inputs": staged["inputs"]}
    if "output" in staged:  # a hidden size's call: the output header it must match
        told["output"] = staged["output"]
    return told


@dataclass
class _Ran:
    """A call the runner has made ("ran" received) and not yet collected."""

    i: int
    kind: str  # check | warmup | timed
    ms: Any  # the runner's own time for it
    took_ms: float  # the parent's clock from "go" to "ran"
    sample: int | None  # SAMPLED_KINDS: their outputs come back only at positions drawn from this, sent at "collect"


class _Calls:
    """Drives the runner's calls. Every call has three phases: "trial" (inputs drawn from the call's seed or
    copied in, allocator poisoned, cache flushed; reply "ready", with the drawn inputs' fingerprint, which must be
    the reference's), "go" (the parent's clock runs from sending it to the arrival of "ran", which carries the
    runner's own time: the call, then its whole output and its inputs as it left them copied to the region) and
    "collect" (reply "done": where they are).

    In lockstep: a call is collected and checked by the reference process (``checks``), which reads the
    region, before the runner is sent anything more. So what the check reads is what the call left, whatever
    code the runner's next steps might trigger; the runner never learns where a call is checked."""

    def __init__(self, outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout, seeded: bool,
                 ref_limit: float, phase: str, budget_s: float) -> None:
        self.outcome, self.ref, self.runner, self.layout = outcome, ref, runner, layout
        self.seeded, self.ref_limit, self.phase, self.budget_s = seeded, ref_limit, phase, budget_s
        self.spent = 0.0  # the runner's time on its calls, against ``budget_s``
        self.staged: dict[str, dict[str, Any]] = {}
        self.samples: dict[int, int] = {}  # sampled calls' sample seeds, drawn with their chunk
        self.ran: _Ran | None = None
        # where the calls' time went, as the runner reports it (a diagnostic only: nothing is decided on it)
        self.busy = {"runner_stage_s": 0.0, "runner_collect_s": 0.0, "go_s": 0.0, "idle_before_go_s": 0.0}

    def _busy(self, key: str, reply: dict[str, Any]) -> None:
        ms = reply.get("busy_ms")
        if _is_time(ms):
            self.busy[key] += ms / 1e3

    def chunk(self, secret: int, start: int, kinds: list[str], limit: float) -> None:
        """The reference draws the inputs of calls [start, start + len(kinds)) and computes their expected outputs
        (with seeded inputs, also each call's seed and fingerprint). A timed or warm-up call's output and inputs
        are checked at positions drawn from a seed drawn now: the reference keeps only the expected values there
        (and the inputs' values at theirs); the seed goes to the reference process only."""
        assert self.ran is None
        self.samples = {start + k: secrets.randbits(63) for k, kind in enumerate(kinds) if kind in SAMPLED_KINDS}
        reply = self.ref.call({"op": "chunk", "secret": secret, "start": start, "count": len(kinds), "seeded": self.seeded,
                               "samples": {str(i): seed for i, seed in self.samples.items()},
                               "variants": hidden_checks.variants(kinds, start)}, limit)
        self.staged = (reply.get("staged") or {}) if self.seeded else {}
        for i, drawn in (reply.get("hidden") or {}).items():  # what each hidden call drew, for the verdict's record
            self.outcome.hidden.setdefault("drawn", {})[i] = drawn

    def run(self, i: int, kind: str, make_request: Callable[[dict[str, Any]], dict[str, Any]], checks: "_Checks") -> bool:
        """Stage and make call ``i`` (``make_request`` turns the reference's stage into the runner's request), once
        the call before it is collected and checked. False when the run ended (``outcome`` says why)."""
        if not self.settle(checks):
            return False
        if self.seeded and str(i) in self.staged:
            staged = self.staged.pop(str(i))
        else:  # inputs written to the region (hidden checks always are)
            staged = self.ref.call({"op": "stage", "i": i, "layout": self.layout.to_json()}, self.ref_limit)
        request, drawn = make_request(staged), staged.get("fingerprint")
        t0 = time.monotonic()
        deadline = t0 + self.budget_s - self.spent
        self.runner.send(request)
        went = self._go(i, self.runner.recv(deadline), drawn, deadline)
        if went is None:
            return False
        self.ran = _Ran(i, kind, went[0], went[1], self.samples.pop(i) if kind in SAMPLED_KINDS else None)
        self.spent += time.monotonic() - t0
        return True

    def _go(self, i: int, ready: dict[str, Any] | Ended, drawn: Any, deadline: float) -> tuple[Any, float] | None:
        """Call ``i``, staged (``ready``): "go", and the runner's own time with the parent's, from "go" to "ran"
        (None when the run ended: ``outcome`` says why)."""
        self.outcome.trial = i
        if not _answered(self.outcome, self.runner, ready, self.phase, "ready"):
            return None
        self._busy("runner_stage_s", ready)
        ready_at = self.runner.reply_at
        if ready.get("i") != i:
            return _malformed(self.outcome, self.runner, i) or None
        if drawn is not None and ready.get("fingerprint") != drawn:
            _violation(self.outcome, self.runner, f"the inputs the runner drew for call {i} differ from the evaluator's "
                       "(was the random number generator tampered with?)")
            return None
        t1 = time.monotonic()
        # how long the staged runner sat idle before "go", a diagnostic for the outside clock: a process woken
        # from a longer sleep answers later
        self.busy["idle_before_go_s"] += max(0.0, t1 - ready_at)
        self.runner.send({"op": "go"})
        ran = self.runner.recv(deadline)
        took_ms = (self.runner.reply_at - t1) * 1e3
        if not _answered(self.outcome, self.runner, ran, self.phase, "ran"):
            return None
        if ran.get("i") != i:
            return _malformed(self.outcome, self.runner, i) or None
        self.busy["go_s"] += took_ms / 1e3
        return ran.get("ms"), took_ms

    def settle(self, checks: "_Checks") -> bool:
        """Collect and check the last call made (before the next call, a new chunk, and at the end)."""
        before, self.ran = self.ran, None
        if before is None:
            return True
        t0 = time.monotonic()
        self.outcome.trial = before.i
        self.runner.send(self._collect(before))
        done = self.runner.recv(t0 + self.budget_s - self.spent)
        self.spent += time.monotonic() - t0
        if not self._collected(before, done):
            return False
        asked = checks.ask(before, done)
        return asked is not None and (not asked or checks.answer(before, asked))

    def _collect(self, ran: _Ran) -> dict[str, Any]:
        return {"op": "collect"}

    def _collected(self, ran: _Ran, done: dict[str, Any] | Ended) -> bool:
        if not _answered(self.outcome, self.runner, done, self.phase, "done"):
            return False
        self._busy("runner_collect_s", done)
        return done.get("i") == ran.i or _malformed(self.outcome, self.runner, ran.i)


class _Checks:
    """What happens to a collected call: ``ask`` sends the reference process its check (returns the request;
    an empty one when nothing is asked; None when the run ended), ``answer`` takes the reply."""

    def ask(self, ran: _Ran, done: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def answer(self, ran: _Ran, asked: dict[str, Any]) -> bool:
        raise NotImplementedError


class _TrialChecks(_Checks):
    """Every call of a run is checked by the reference process against its own output for the same inputs, and
    its inputs as the call left them against what was drawn: whole on correctness calls, at sampled positions on
    the others (read by the reference process from the runner's whole copies in the region)."""

    def __init__(self, outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout,
                 config: BenchConfig) -> None:
        self.outcome, self.ref, self.runner, self.layout, self.config = outcome, ref, runner, layout, config
        self.tolerances = {k: {"atol": v.atol, "rtol": v.rtol} for k, v in config.tolerances.items()}

    def ask(self, ran: _Ran, done: dict[str, Any]) -> dict[str, Any] | None:
        if not isinstance(done.get("outputs"), dict) or not isinstance(done.get("after"), dict) \
                or (ran.kind == "timed" and not _is_time(ran.ms)):
            _violation(self.outcome, self.runner, f"the runner's report on call {ran.i} is malformed")
            return None
        request = {"op": "check", "i": ran.i, "layout": self.layout.to_json(), "outputs": done["outputs"],
                   "after": done["after"], "tolerances": self.tolerances, "sample": ran.sample}
        self.ref.ask(request)
        return request

    def answer(self, ran: _Ran, asked: dict[str, Any]) -> bool:
        check = self.ref.answer(asked, self.config.hang_ceiling_s + REFERENCE_SLACK_S)
        outcome = self.outcome
        if outcome.rule == "protocol_violation":
            return False  # the runner broke the protocol while this check ran: that is what the run ends on
        outcome.checked_calls += 1
        if not check["ok"]:
            if check.get("malformed"):
                _violation(outcome, self.runner, check["reason"])
                return False
            outcome.status = "incorrect"
            if hidden_checks.is_hidden(ran.kind):  # the feedback names neither the shape nor the distribution
                outcome.reason = hidden_checks.FEEDBACK
                outcome.hidden["failed"] = {"check": hidden_checks.name_of(ran.kind), "call": ran.i,
                                            "reason": check["reason"], "max_abs_diff": check.get("max_abs_diff")}
            else:
                outcome.reason = _where(ran.kind, ran.i, self.config) + check["reason"]
                outcome.max_abs_diff = check.get("max_abs_diff") or 0.0
            _finish(outcome, self.runner)
            return False
        if hidden_checks.is_hidden(ran.kind):
            outcome.hidden["passed"].append(hidden_checks.name_of(ran.kind))
            return True
        outcome.max_abs_diff = max(outcome.max_abs_diff, check.get("max_abs_diff") or 0.0)
        if ran.kind == "check":
            outcome.correctness_trials += 1
        if ran.kind == "timed":
            outcome.new_ms.append(float(ran.ms))
            outcome.outside_ms.append(ran.took_ms)
        return True


class _CalibrationRecord(_Checks):
    """Calibration calls record their times. The reference process checks them as it checks a candidate's timed
    calls, and the verdict is dropped (the stand-in's output is zeros): so the runner waits for "go" as long as
    it will on the candidate's calls (a process woken from a longer wait answers later, which the parent's
    clock would otherwise count against the candidate)."""

    def __init__(self, outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout,
                 config: BenchConfig) -> None:
        self.outcome, self.runner = outcome, runner
        self.checks = _TrialChecks(outcome, ref, runner, layout, config)

    def ask(self, ran: _Ran, done: dict[str, Any]) -> dict[str, Any] | None:
        if not _is_time(ran.ms):
            _violation(self.outcome, self.runner, "the runner's calibration report is malformed")
            return None
        self.outcome.calibration_ms.append(float(ran.ms))
        self.outcome.calibration_outside_ms.append(ran.took_ms)
        if not isinstance(done.get("outputs"), dict) or not isinstance(done.get("after"), dict):
            return {}
        return self.checks.ask(ran, done)

    def answer(self, ran: _Ran, asked: dict[str, Any]) -> bool:
        self.checks.ref.answer(asked, self.checks.config.hang_ceiling_s + REFERENCE_SLACK_S)
        return True


def _malformed(outcome: RunOutcome, runner: WorkerProcess, i: int) -> bool:
    _violation(outcome, runner, f"the runner's report on call {i} is malformed")
    return False


def _is_time(ms: Any) -> bool:
    return isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) and ms >= 0


def _where(kind: str, i: int, config: BenchConfig) -> str:
    if kind == "timed":
        return (f"wrong output on timed call {i - config.correctness_trials - config.warmup_trials + 1} "
                "(every call gets fresh inputs and is checked; no caching across calls): ")
    if kind == "warmup":
        return f"wrong output on warm-up call {i - config.correctness_trials + 1}: "
    if i < config.correctness_trials:
        return f"trial {i + 1}/{config.correctness_trials}: "
    return "wrong output on the correctness check after timing (state kept across calls?): "


def _answered(outcome: RunOutcome, runner: WorkerProcess, reply: dict[str, Any] | Ended, phase: str, expected: str) -> bool:
    """True when ``reply`` is the expected one; otherwise ``outcome`` records why the run ended."""
    outcome.phase = phase
    if isinstance(reply, Ended):
        if reply.how == "garbage":
            _violation(outcome, runner, f"the runner wrote something that is not a message it may send during "
                       f"{phase} ({reply.detail[:240]})")
            return False
        outcome.status, outcome.ended = "ended", reply
        _finish(outcome, runner)
        return False
    op = reply.get("op")
    if op == expected:
        return True
    if op == "rejected" and reply.get("status") in RUNNER_STATUSES:
        outcome.status = reply["status"]
        outcome.reason, outcome.rule, outcome.detail = str(reply.get("reason", "")), reply.get("rule"), str(reply.get("detail", ""))
    elif op == "needs_build" and phase == "load" and isinstance(reply.get("spec"), dict):
        outcome.status, outcome.needs_build = "needs_build", reply["spec"]
    elif op == "worker_error":
        outcome.status, outcome.reason = "crashed", f"the runner failed: {reply.get('reason', '')}"
    else:
        _violation(outcome, runner, f"unexpected message {op!r} from the runner during {phase}")
        return False
    _finish(outcome, runner)
    return False


def _violation(outcome: RunOutcome, runner: WorkerProcess, reason: str) -> RunOutcome:
    outcome.status, outcome.rule = "forbidden", "protocol_violation"
    outcome.reason = f"protocol_violation: {reason}; the run counts for nothing"
    return _finish(outcome, runner)


def _reference_failed(outcome: RunOutcome, exc: ReferenceFailed) -> RunOutcome:
    outcome.status, outcome.phase = "reference_failed", "reference"
    outcome.reason, outcome.detail = exc.reason, exc.detail
    return outcome


def _finish(outcome: RunOutcome, runner: WorkerProcess) -> RunOutcome:
    outcome.output_tail = runner.output_tail()
    outcome.output_bytes = runner.output_bytes
    if runner.proc.returncode is not None:
        outcome.returncode, outcome.signal = runner.proc.returncode, runner.signal_name()
    return outcome
