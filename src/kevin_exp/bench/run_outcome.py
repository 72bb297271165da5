"""What one candidate's run left behind (``RunOutcome``; ``verdict.verdict_from_run`` turns it into a verdict),
and how a run ends early: a reply that is not the one expected (``answered``), a protocol violation, a reference
that failed. ``finish`` adds what the runner printed and how it exited."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kevin_exp.bench.reference_process import ReferenceFailed
from kevin_exp.bench.worker_process import Ended, WorkerProcess

# what a runner may say about its own candidate; "ok" is never its to say
RUNNER_STATUSES = frozenset({"runtime_error", "forbidden", "format_error", "compile_error", "incorrect"})


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
    # where the runner left each call's output and post-call inputs: "device" (a device region, cuda) | "host"
    # (the shared memory file), with why a device region was not used where one was asked for
    exchange: dict[str, Any] = field(default_factory=dict)
    cores: list[int] = field(default_factory=list)  # the run slot's own cores the run was on (empty: none reserved)
    hidden: dict[str, Any] = field(default_factory=dict)  # the hidden checks: asked, skipped, passed, failed (never fed back)
    floor: dict[str, Any] | None = None  # the problem's physical floor on this machine (physical_floor.floor_record)
    # the share of the calibration calls' and of the trials' wall time during which some task waited for a CPU
    contention: dict[str, float | None] = field(default_factory=dict)


def malformed(outcome: RunOutcome, runner: WorkerProcess, i: int) -> bool:
    violation(outcome, runner, f"the runner's report on call {i} is malformed")
    return False


def is_time(ms: Any) -> bool:
    return isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) and ms >= 0


def answered(outcome: RunOutcome, runner: WorkerProcess, reply: dict[str, Any] | Ended, phase: str, expected: str) -> bool:
    """True when ``reply`` is the expected one; otherwise ``outcome`` records why the run ended."""
    outcome.phase = phase
    if isinstance(reply, Ended):
        if reply.how == "garbage":
            violation(outcome, runner, f"the runner wrote something that is not a message it may send during "
                       f"{phase} ({reply.detail[:240]})")
            return False
        outcome.status, outcome.ended = "ended", reply
        finish(outcome, runner)
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
        violation(outcome, runner, f"unexpected message {op!r} from the runner during {phase}")
        return False
    finish(outcome, runner)
    return False


def violation(outcome: RunOutcome, runner: WorkerProcess, reason: str) -> RunOutcome:
    outcome.status, outcome.rule = "forbidden", "protocol_violation"
    outcome.reason = f"protocol_violation: {reason}; the run counts for nothing"
    return finish(outcome, runner)


def reference_failed(outcome: RunOutcome, exc: ReferenceFailed) -> RunOutcome:
    outcome.status, outcome.phase = "reference_failed", "reference"
    outcome.reason, outcome.detail = exc.reason, exc.detail
    return outcome


def finish(outcome: RunOutcome, runner: WorkerProcess) -> RunOutcome:
    outcome.output_tail = runner.output_tail()
    outcome.output_bytes = runner.output_bytes
    if runner.proc.returncode is not None:
        outcome.returncode, outcome.signal = runner.proc.returncode, runner.signal_name()
    return outcome
