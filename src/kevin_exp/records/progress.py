"""Progress display: a live bar on a terminal, plain periodic lines otherwise (SLURM logs, pipes)."""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """Steps are 1-based: ``steps_done`` is how many of ``total_steps`` finished before this start."""

    def __init__(self, mode: str, total_steps: int, steps_done: int, units_per_step: int) -> None:
        if mode == "auto":
            mode = "bar" if sys.stdout.isatty() else "lines"
        if mode not in ("bar", "lines", "none"):
            raise ValueError(f"logger.progress={mode!r}: expected auto, bar, lines or none")
        self.mode, self.total_steps, self.units = mode, total_steps, units_per_step
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.monotonic()
        if mode == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self._bar.start()
            self._task = self._bar.add_task("training", total=(total_steps - steps_done) * units_per_step)

    def turn(self, step: int, turn: int, group: int, generate_s: float) -> None:
        msg = f"step {step}/{self.total_steps} turn {turn + 1} group {group + 1}: generated in {generate_s:.1f} s"
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=msg)
        elif self.mode == "lines":
            print(f"[{time.monotonic() - self._t0:7.0f}s] {msg}", flush=True)

    def step(self, metrics: dict[str, Any]) -> None:
        line = (
            f"step {metrics['step']}/{self.total_steps}: reward {metrics['reward_mean']:.3f} (max {metrics['reward_max']:.3f}), "
            f"correct {metrics['correct_ratio']:.0%}, loss {metrics['loss']:.4g}, grad norm {metrics['grad_norm']:.3g}, "
            f"{metrics['generate_s']:.0f}/{metrics['evaluate_s']:.0f}/{metrics['train_s']:.0f} s gen/eval/train"
        )
        if self._bar is not None:
            self._bar.console.print(line)
        elif self.mode == "lines":
            print(f"[{time.monotonic() - self._t0:7.0f}s] {line}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
