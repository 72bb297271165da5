"""The runner's calls, one at a time in lockstep with the reference process (``protocol.run_protocol`` drives
them): each call staged, made and collected (``Calls``), then checked by the reference process before the
runner is sent anything more (``TrialChecks``; calibration calls only record their times: ``CalibrationRecord``)."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from kevin_exp.bench import hidden_checks
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.exchange import Layout
from kevin_exp.bench.reference_process import ReferenceProcess
from kevin_exp.bench.run_outcome import RunOutcome, answered, finish, is_time, malformed, violation
from kevin_exp.bench.worker_process import Ended, WorkerProcess

REFERENCE_SLACK_S = 60.0  # a reference request's own limit, beyond the run's
# calls whose outputs and inputs are checked at sampled positions (host work); checked calls compare them whole
SAMPLED_KINDS = frozenset({"warmup", "timed"})


@dataclass
class Ran:
    """A call the runner has made ("ran" received) and not yet collected."""

    i: int
    kind: str  # check | warmup | timed
    ms: Any  # the runner's own time for it
    took_ms: float  # the parent's clock from "go" to "ran"
    sample: int | None  # SAMPLED_KINDS: their outputs come back only at positions drawn from this, sent at "collect"


class Calls:
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
        self.ran: Ran | None = None
        # where the calls' time went, as the runner reports it (a diagnostic only: nothing is decided on it)
        self.busy = {"runner_stage_s": 0.0, "runner_collect_s": 0.0, "go_s": 0.0, "idle_before_go_s": 0.0}

    def _busy(self, key: str, reply: dict[str, Any]) -> None:
        ms = reply.get("busy_ms")
        if is_time(ms):
            self.busy[key] += ms / 1e3

    def chunk(self, secret: int, start: int, kinds: list[str], limit: float, same_inputs: bool = False) -> None:
        """The reference draws the inputs of calls [start, start + len(kinds)) and computes their expected outputs
        (with seeded inputs, also each call's seed and fingerprint). A timed or warm-up call's output and inputs
        are checked at positions drawn from a seed drawn now: the reference keeps only the expected values there
        (and the inputs' values at theirs); the seed goes to the reference process only. ``same_inputs``: every call
        gets the first one's inputs (the calibration, where no candidate code is loaded to learn it)."""
        assert self.ran is None
        self.samples = {start + k: secrets.randbits(63) for k, kind in enumerate(kinds) if kind in SAMPLED_KINDS}
        reply = self.ref.call({"op": "chunk", "secret": secret, "start": start, "count": len(kinds), "seeded": self.seeded,
                               "samples": {str(i): seed for i, seed in self.samples.items()},
                               "variants": hidden_checks.variants(kinds, start), "same_inputs": same_inputs}, limit)
        self.staged = (reply.get("staged") or {}) if self.seeded else {}
        for i, drawn in (reply.get("hidden") or {}).items():  # what each hidden call drew, for the verdict's record
            self.outcome.hidden.setdefault("drawn", {})[i] = drawn

    def run(self, i: int, kind: str, make_request: Callable[[dict[str, Any]], dict[str, Any]], checks: "Checks") -> bool:
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
        self.ran = Ran(i, kind, went[0], went[1], self.samples.pop(i) if kind in SAMPLED_KINDS else None)
        self.spent += time.monotonic() - t0
        return True

    def _go(self, i: int, ready: dict[str, Any] | Ended, drawn: Any, deadline: float) -> tuple[Any, float] | None:
        """Call ``i``, staged (``ready``): "go", and the runner's own time with the parent's, from "go" to "ran"
        (None when the run ended: ``outcome`` says why)."""
        self.outcome.trial = i
        if not answered(self.outcome, self.runner, ready, self.phase, "ready"):
            return None
        self._busy("runner_stage_s", ready)
        ready_at = self.runner.reply_at
        if ready.get("i") != i:
            return malformed(self.outcome, self.runner, i) or None
        if drawn is not None and ready.get("fingerprint") != drawn:
            violation(self.outcome, self.runner, f"the inputs the runner drew for call {i} differ from the evaluator's "
                       "(was the random number generator tampered with?)")
            return None
        t1 = time.monotonic()
        # how long the staged runner sat idle before "go", a diagnostic for the outside clock: a process woken
        # from a longer sleep answers later
        self.busy["idle_before_go_s"] += max(0.0, t1 - ready_at)
        self.runner.send({"op": "go"})
        ran = self.runner.recv(deadline)
        took_ms = (self.runner.reply_at - t1) * 1e3
        if not answered(self.outcome, self.runner, ran, self.phase, "ran"):
            return None
        if ran.get("i") != i:
            return malformed(self.outcome, self.runner, i) or None
        self.busy["go_s"] += took_ms / 1e3
        return ran.get("ms"), took_ms

    def settle(self, checks: "Checks") -> bool:
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

    def _collect(self, ran: Ran) -> dict[str, Any]:
        return {"op": "collect"}

    def _collected(self, ran: Ran, done: dict[str, Any] | Ended) -> bool:
        if not answered(self.outcome, self.runner, done, self.phase, "done"):
            return False
        self._busy("runner_collect_s", done)
        return done.get("i") == ran.i or malformed(self.outcome, self.runner, ran.i)


class Checks:
    """What happens to a collected call: ``ask`` sends the reference process its check (returns the request;
    an empty one when nothing is asked; None when the run ended), ``answer`` takes the reply."""

    def ask(self, ran: Ran, done: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def answer(self, ran: Ran, asked: dict[str, Any]) -> bool:
        raise NotImplementedError


class TrialChecks(Checks):
    """Every call of a run is checked by the reference process against its own output for the same inputs, and
    its inputs as the call left them against what was drawn: whole on correctness calls, at sampled positions on
    the others (read by the reference process from the runner's whole copies in the region)."""

    def __init__(self, outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout,
                 config: BenchConfig) -> None:
        self.outcome, self.ref, self.runner, self.layout, self.config = outcome, ref, runner, layout, config
        self.tolerances = {k: {"atol": v.atol, "rtol": v.rtol} for k, v in config.tolerances.items()}

    def ask(self, ran: Ran, done: dict[str, Any]) -> dict[str, Any] | None:
        if not isinstance(done.get("outputs"), dict) or not isinstance(done.get("after"), dict) \
                or (ran.kind == "timed" and not is_time(ran.ms)):
            violation(self.outcome, self.runner, f"the runner's report on call {ran.i} is malformed")
            return None
        request = {"op": "check", "i": ran.i, "layout": self.layout.to_json(), "outputs": done["outputs"],
                   "after": done["after"], "tolerances": self.tolerances, "sample": ran.sample,
                   "device": self.outcome.exchange.get("where") == "device"}
        self.ref.ask(request)
        return request

    def answer(self, ran: Ran, asked: dict[str, Any]) -> bool:
        check = self.ref.answer(asked, self.config.hang_ceiling_s + REFERENCE_SLACK_S)
        outcome = self.outcome
        if outcome.rule == "protocol_violation":
            return False  # the runner broke the protocol while this check ran: that is what the run ends on
        outcome.checked_calls += 1
        if not check["ok"]:
            if check.get("malformed"):
                violation(outcome, self.runner, check["reason"])
                return False
            outcome.status = "incorrect"
            if hidden_checks.is_hidden(ran.kind):  # the feedback names neither the shape nor the distribution
                outcome.reason = hidden_checks.FEEDBACK
                outcome.hidden["failed"] = {"check": hidden_checks.name_of(ran.kind), "call": ran.i,
                                            "reason": check["reason"], "max_abs_diff": check.get("max_abs_diff")}
            else:
                outcome.reason = _where(ran.kind, ran.i, self.config) + check["reason"]
                outcome.max_abs_diff = check.get("max_abs_diff") or 0.0
            finish(outcome, self.runner)
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


class CalibrationRecord(Checks):
    """Calibration calls record their times. The reference process checks them as it checks a candidate's timed
    calls, and the verdict is dropped (the stand-in's output is zeros): so the runner waits for "go" as long as
    it will on the candidate's calls (a process woken from a longer wait answers later, which the parent's
    clock would otherwise count against the candidate)."""

    def __init__(self, outcome: RunOutcome, ref: ReferenceProcess, runner: WorkerProcess, layout: Layout,
                 config: BenchConfig) -> None:
        self.outcome, self.runner = outcome, runner
        self.checks = TrialChecks(outcome, ref, runner, layout, config)

    def ask(self, ran: Ran, done: dict[str, Any]) -> dict[str, Any] | None:
        if not is_time(ran.ms):
            violation(self.outcome, self.runner, "the runner's calibration report is malformed")
            return None
        self.outcome.calibration_ms.append(float(ran.ms))
        self.outcome.calibration_outside_ms.append(ran.took_ms)
        if not isinstance(done.get("outputs"), dict) or not isinstance(done.get("after"), dict):
            return {}
        return self.checks.ask(ran, done)

    def answer(self, ran: Ran, asked: dict[str, Any]) -> bool:
        self.checks.ref.answer(asked, self.checks.config.hang_ceiling_s + REFERENCE_SLACK_S)
        return True


def _where(kind: str, i: int, config: BenchConfig) -> str:
    if kind == "timed":
        return (f"wrong output on timed call {i - config.correctness_trials - config.warmup_trials + 1} "
                "(every call gets fresh inputs and is checked; no caching across calls): ")
    if kind == "warmup":
        return f"wrong output on warm-up call {i - config.correctness_trials + 1}: "
    if i < config.correctness_trials:
        return f"trial {i + 1}/{config.correctness_trials}: "
    return "wrong output on the correctness check after timing (state kept across calls?): "
