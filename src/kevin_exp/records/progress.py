"""Progress display: a live bar on a terminal, plain periodic lines otherwise (SLURM logs, pipes).

Plain lines, each after the seconds since the display started:

- a turn's first generation: ``step 3/10 turn 2 group 1: generated in 41.2 s``;
- within a turn, at most every ``every_s`` seconds and only when something changed: each started turn that still
  waits for verdicts, and the generate() call under way (``RolloutCounts``, rollout/loop.py):
  ``step 3/10 turn 2/4: 40/64 generated, 12/64 evaluated; generating 24 (8 done, token 210/512)``;
- a step's end: its metrics, then the step's time, the mean time per step of this process (a resumed run measures
  from its restart) and the time to the end of the run at that mean: ``...; 52s (mean 49s/step), ~5m43s left``.

An evaluation counts batches (``unit="batch"``): ``batch 2/5 turn 1 ...`` and ``batch 2/5 done; ...``. The bar shows
the same texts (within a turn, refreshed live). ``mode="none"`` prints nothing.

``sweep_line``: the SLURM launcher's line while it waits for a sweep's jobs (hydra_plugins/kevin_exp_launcher).
"""
from __future__ import annotations

import heapq
import sys
import threading
import time
from typing import Any, Callable, Sequence

from kevin_exp.rollout.loop import RolloutCounts

# plain lines within a turn: at most one this often (a SLURM log stays readable); the bar's text: this often
EVERY_S = 30.0
BAR_EVERY_S = 0.5


class Progress:
    """Steps are 1-based: ``steps_done`` is how many of ``total_steps`` finished before this start. ``clock``:
    seconds, monotonic (a test's fake clock)."""

    def __init__(self, mode: str, total_steps: int, steps_done: int, units_per_step: int, unit: str = "step",
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        if mode == "auto":
            mode = "bar" if sys.stdout.isatty() else "lines"
        if mode not in ("bar", "lines", "none"):
            raise ValueError(f"logger.progress={mode!r}: expected auto, bar, lines or none")
        self.mode, self.total_steps, self.units, self.unit = mode, total_steps, units_per_step, unit
        self.every_s, self.clock = every_s, clock
        self._bar: Any = None
        self._task: Any = None
        self._t0 = self._last_end = clock()
        self._ended = 0  # steps ended in this process
        self._last_shown = float("-inf")  # when a line was printed (or the bar's text changed) last
        self._shown: tuple | None = None  # the counts a line within a turn showed last
        # lines come from the rollout's thread, a step ahead's and the environment's (verdicts)
        self._lock = threading.Lock()
        if mode == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar.start()
            self._task = self._bar.add_task("training", total=(total_steps - steps_done) * units_per_step)

    def turn(self, step: int, turn: int, group: int, generate_s: float) -> None:
        msg = f"{self.unit} {step}/{self.total_steps} turn {turn + 1} group {group + 1}: generated in {generate_s:.1f} s"
        if self._bar is not None:
            with self._lock:
                self._bar.update(self._task, advance=1, description=msg)
        elif self.mode == "lines":
            self._print(msg)

    def within(self, step: int, counts: RolloutCounts) -> None:
        """The rollout's counts changed (rollout/loop.py, ``on_progress``): shown at a bounded rate."""
        if self.mode == "none":
            return
        now = self.clock()
        if now - self._last_shown < (BAR_EVERY_S if self._bar is not None else self.every_s):
            return
        snapshot = counts.snapshot()
        with self._lock:
            if snapshot == self._shown or now - self._last_shown < (BAR_EVERY_S if self._bar is not None else self.every_s):
                return
            self._shown, self._last_shown = snapshot, now
            msg = f"{self.unit} {step}/{self.total_steps} {counts_text(counts)}"
            if self._bar is not None:
                self._bar.update(self._task, description=msg)
            else:
                print(f"[{now - self._t0:7.0f}s] {msg}", flush=True)

    def step(self, metrics: dict[str, Any]) -> None:
        line = (
            f"step {metrics['step']}/{self.total_steps}: reward {metrics['reward_mean']:.3f} (max {metrics['reward_max']:.3f}), "
            f"correct {metrics['correct_ratio']:.0%}, loss {metrics['loss']:.4g}, grad norm {metrics['grad_norm']:.3g}, "
            f"{metrics['generate_s']:.0f}/{metrics['evaluate_s']:.0f}/{metrics['train_s']:.0f} s gen/eval/train; "
            f"{self._timing(metrics['step'])}"
        )
        self._show(line)

    def done(self, step: int) -> None:
        """A step (a batch of an evaluation) ended: its time, the mean and the time left."""
        self._show(f"{self.unit} {step}/{self.total_steps} done; {self._timing(step)}")

    def _timing(self, step: int) -> str:
        """The step that just ended: its time (since the previous one ended, or the display started), the mean
        over this process's steps, and the time to the end of the run at that mean."""
        now = self.clock()
        this, self._last_end = now - self._last_end, now
        self._ended += 1
        mean = (now - self._t0) / self._ended
        text = f"{duration(this)} (mean {duration(mean)}/{self.unit})"
        left = self.total_steps - step
        return text + (f", ~{duration(mean * left)} left" if left > 0 else "")

    def _show(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line)
        elif self.mode == "lines":
            self._print(line)

    def _print(self, msg: str) -> None:
        with self._lock:
            now = self.clock()
            self._last_shown = now
            print(f"[{now - self._t0:7.0f}s] {msg}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def counts_text(counts: RolloutCounts) -> str:
    """Each started turn that still waits for verdicts, and the generate() call under way."""
    per, n = counts.per_turn, counts.n_turns
    parts = [f"turn {t + 1}/{n}: {counts.generated[t]}/{per} generated, {counts.evaluated[t]}/{per} evaluated"
             for t in range(n) if (counts.generated[t] or t in counts.call_turns) and counts.evaluated[t] < per]
    if counts.calling:
        details = ([f"{counts.call_done} done"] if counts.call_done else []) + (
            [f"token {counts.call_tokens}/{counts.max_new_tokens}"] if counts.call_tokens else [])
        parts.append(f"generating {counts.calling}" + (f" ({', '.join(details)})" if details else ""))
    return "; ".join(parts) or "waiting"


def duration(seconds: float) -> str:
    """``4.2s``, ``42s``, ``5m43s``, ``2h05m``, ``1d03h``."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    s = round(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def sweep_time_left(durations_s: Sequence[float], running_s: Sequence[float], pending: int, parallel: int) -> float | None:
    """Seconds until a sweep's last job ends, from the mean time of its jobs that ended (None before one has):
    each running job takes the mean less the time it has run (at least 0), and each pending job the mean, in the
    first of ``parallel`` slots to free up (at least as many slots as jobs running)."""
    if not durations_s:
        return None
    mean = sum(durations_s) / len(durations_s)
    slots = [max(mean - s, 0.0) for s in running_s]
    slots += [0.0] * (max(parallel, 1) - len(slots))
    heapq.heapify(slots)
    for _ in range(pending):
        heapq.heappush(slots, heapq.heappop(slots) + mean)
    return max(slots)


def sweep_line(total: int, ended: int, failed: int, running: int, pending: int, durations_s: Sequence[float],
               running_s: Sequence[float], parallel: int, elapsed_s: float) -> str:
    """The launcher's line while it waits: jobs ended (failed among them), running and pending, and, once a job
    has ended well, the mean time per job and the time to the end of the sweep (``sweep_time_left``)."""
    line = f"sweep ({duration(elapsed_s)} in): {ended}/{total} jobs done" + (f" ({failed} failed)" if failed else "")
    if running or pending:
        line += f", {running} running, {pending} pending"
    left = sweep_time_left(durations_s, running_s, pending, parallel)
    if left is not None:
        mean = sum(durations_s) / len(durations_s)
        line += f"; {duration(mean)}/job (mean of {len(durations_s)})"
        if running or pending:
            line += f", ~{duration(left)} left"
    return line
