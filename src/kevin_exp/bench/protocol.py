"""One candidate's run, driven by the parent in lockstep between the trusted reference process and the
candidate's runner (docs/hack_defences.md, "Where things run").

Schedule of calls, each on fresh inputs drawn from a secret per-evaluation seed and each checked by the
reference process, outputs and inputs: ``correctness_trials`` checked calls, ``warmup_trials``, ``timed_trials``
timed calls, then one more checked call drawn after all timing. The runner is told of a call only whether it
is timed: every call is staged the same way (allocator poisoned) and copies its whole output and its inputs as
it left them to the region. The reference process prepares inputs and expected outputs in chunks bounded by
bytes, only while the runner is idle; the runner sees one trial's inputs at a time. Every call has three phases
(stage, go, collect: ``trial_calls.Calls``); the parent's own clock brackets "go", the call and the copies that make its
output final, and bounds the candidate's time from below (``verdict.timing_bound``). A call is checked before the
runner is sent anything more.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

from kevin_exp.bench import cpu_pressure, hidden_checks
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.exchange import Layout, header_bytes, padded_bytes, seal_size
from kevin_exp.bench.physical_floor import floor_record
from kevin_exp.bench.reference_process import START_TIMEOUT_S, ReferenceFailed, ReferenceProcess, ReferenceTimings
from kevin_exp.bench.reference_timing import REFERENCE_TIMING_BLOCKS, Measurement, settle
from kevin_exp.bench.run_outcome import RunOutcome, answered, finish, is_time, reference_failed
from kevin_exp.bench.trial_calls import REFERENCE_SLACK_S, SAMPLED_KINDS, CalibrationRecord, Calls, TrialChecks
from kevin_exp.bench.worker_process import WorkerProcess

CALIBRATION_CALLS = 20
# the parts of the runner's load it reports (``worker/runner.Runner``), kept in the verdict's phases as load_<part>_s
LOAD_PHASES = ("region", "snapshots", "module", "construct", "collect")


@dataclass(frozen=True)
class RunJob:
    reference: str
    candidate: str
    prebuilt: dict[str, list[str]]


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
        contention = cpu_pressure.Window()
        for _ in range(REFERENCE_TIMING_BLOCKS):
            reply = ref.call({"op": "time", "seed": secrets.randbits(63), "warmup": config.warmup_trials,
                              "trials": config.timed_trials}, limit)
            blocks.append([float(x) for x in reply["ms"]])
        return Measurement.from_blocks(blocks, config.timing_statistic, contention.share())

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
        return reference_failed(outcome, exc)

    ready = runner.wait_ready(START_TIMEOUT_S)
    if not answered(outcome, runner, ready, "start", "ready"):
        return outcome
    lap("runner_ready_s")  # waiting for a standby runner to finish starting
    outcome.exchange = {"where": "host"}
    if config.backend == "cuda" and config.device_exchange:
        try:
            if not _device_region(outcome, ref, runner, layout, ref_limit, config):
                return outcome
        except ReferenceFailed as exc:
            return reference_failed(outcome, exc)
        lap("device_region_s")
    with device_quiet() as waited:
        if waited:
            outcome.phases["device_quiet_wait_s"] = round(waited, 4)
        clock[0] = time.monotonic()
        seeded = bool(prepared.get("seeded"))
        outcome.inputs = "seeded" if seeded else "region"
        if seeded:
            runner.send({"op": "problem", "source": job.reference, "backend": config.backend})
            if not answered(outcome, runner, runner.recv(time.monotonic() + config.load_timeout_s), "start", "problem_ready"):
                return outcome
        try:
            calibration = cpu_pressure.Window()
            if not _calibrate(outcome, ref, runner, layout, prepared["output"], secret, ref_limit, config, seeded):
                return outcome
            init = ref.call({"op": "stage_init", "layout": layout.to_json()}, ref_limit)["inputs"]
        except ReferenceFailed as exc:
            return reference_failed(outcome, exc)
        outcome.contention["calibration"] = calibration.share()
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
        if not answered(outcome, runner, reply, "load", "loaded"):
            return outcome
        lap("load_s")
        told = reply.get("load_phases") or {}
        outcome.phases.update({f"load_{k}_s": told[k] for k in LOAD_PHASES if is_time(told.get(k))})

        starts = chunk_plan(kinds, seeded, header_bytes(prepared["input"]), header_bytes(prepared["output"]),
                            config.chunk_bytes)
        calls = Calls(outcome, ref, runner, layout, seeded, ref_limit, "trials", outcome.limits["trials_s"])
        busy_before, by_op_before = ref.busy_s, dict(ref.busy_by_op)
        checks = TrialChecks(outcome, ref, runner, layout, config)
        trials = cpu_pressure.Window()
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
            outcome.contention["trials"] = trials.share()
            lap("trials_s")
            outcome.phases.update({k: round(v, 4) for k, v in calls.busy.items()})
            outcome.phases["trials_reference_busy_s"] = round(ref.busy_s - busy_before, 4)
            for op in ("chunk", "check"):
                outcome.phases[f"trials_reference_{op}_s"] = round(ref.busy_by_op.get(op, 0.0) - by_op_before.get(op, 0.0), 4)
            runner.send({"op": "end"})
            reply = runner.recv(time.monotonic() + max(5.0, calls.budget_s - calls.spent))
            if not answered(outcome, runner, reply, "end", "ended"):
                return outcome
            ref.call({"op": "release"}, ref_limit)
            lap("end_s")
        except ReferenceFailed as exc:
            return reference_failed(outcome, exc)
        return finish(outcome, runner)


def _device_region(outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout, ref_limit: float,
                   config: BenchConfig) -> bool:
    """Before any candidate code: the reference process makes the run's device region (``device_exchange``) and the
    runner maps it, so each call's output and post-call inputs are copied there, device to device, and read in place.
    Where either cannot, the run keeps the host region and ``outcome.exchange`` says why. False when the runner
    ended (``outcome`` says why)."""
    made = ref.device_region(layout.outputs_at, layout.size - layout.outputs_at, ref_limit)
    if isinstance(made, str):
        outcome.exchange["why"] = f"the reference process could not make one: {made}"[:1000]
        return True
    fd, nbytes = made
    try:
        sent = runner.send_fd(fd)
    finally:
        os.close(fd)
    if not sent:
        outcome.exchange["why"] = "the runner's socket did not take the descriptor"
        return True
    runner.send({"op": "device_region", "base": layout.outputs_at, "bytes": nbytes})
    reply = runner.recv(time.monotonic() + config.load_timeout_s)
    if not answered(outcome, runner, reply, "start", "device_region"):
        return False
    if reply["where"] == "device":
        outcome.exchange = {"where": "device", "bytes": nbytes}
    else:
        outcome.exchange["why"] = f"the runner could not map it: {reply.get('why', '')}"[:1000]
    return True


def _calibrate(outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout, output: dict[str, Any],
               secret: int, ref_limit: float, config: BenchConfig, seeded: bool) -> bool:
    """Before any candidate code is loaded, the runner makes ``CALIBRATION_CALLS`` timed calls through exactly
    the phases of a candidate's timed call (``Calls``) with a stand-in that only fills an output of the
    expected shape: what the parent's clock sees of a call beyond its reported time when nothing under-reports
    (``verdict.timing_bound`` subtracts it from the candidate's outside time)."""
    calls = Calls(outcome, ref, runner, layout, seeded, ref_limit, "start", config.load_timeout_s)
    # one input set for all of them: the stand-in ignores its inputs' values, and drawing a fresh set per call (on
    # both sides) was most of a cpu run's calibration time
    calls.chunk(secret, -CALIBRATION_CALLS, ["timed"] * CALIBRATION_CALLS, ref_limit, same_inputs=True)
    record = CalibrationRecord(outcome, ref, runner, layout, config)
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
