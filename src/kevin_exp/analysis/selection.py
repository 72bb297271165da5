"""Which rows an analysis reads: one split, and per run a step window. Each (run, split, step) is one
evaluation block: its tasks were each attempted by k trajectories of n turns."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Sequence

import pandas as pd

from kevin_exp.analysis.loading import Run, constant_columns
from kevin_exp.errors import UserError

SPLITS = ("train", "eval")
ROW_COLUMNS = ("seed", "block", "task_id", "trajectory", "turn", "correct", "speedup")

# The training settings an evaluation row records: those of the checkpoint it evaluated, not of the evaluation
# job (whose config.json holds the evaluation's own defaults there). ``model`` is left to the config: the
# evaluation loads the checkpoint's weights into its own model, so the two agree.
TRAINING_COLUMNS = ("gamma", "n_turns", "n_trajectories", "tasks_per_step", "normalization", "aggregation",
                    "estimator", "seed")


@dataclass(frozen=True)
class StepWindow:
    """``last`` (each run's last step of the split), ``all``, or ``a:b`` (steps a..b, both included; either
    end may be left open)."""

    kind: str
    start: int | None = None
    stop: int | None = None

    @classmethod
    def parse(cls, text: str) -> StepWindow:
        if text in ("last", "all"):
            return cls(text)
        match = re.fullmatch(r"(\d*):(\d*)", text)
        if not match:
            raise UserError(f"--steps {text!r}: expected last, all, or a:b (steps a to b, both included; "
                            "the first training step is 1)")
        start, stop = (int(g) if g else None for g in match.groups())
        if start is not None and stop is not None and stop < start:
            raise UserError(f"--steps {text!r}: the window ends before it starts")
        return cls("range", start, stop)

    def mask(self, steps: pd.Series) -> pd.Series:
        if self.kind == "last":
            return steps == steps.max()
        mask = pd.Series(True, index=steps.index)
        if self.start is not None:
            mask &= steps >= self.start
        if self.stop is not None:
            mask &= steps <= self.stop
        return mask

    def __str__(self) -> str:
        if self.kind != "range":
            return self.kind
        return f"{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"


def _split_rows(run: Run, split: str) -> pd.DataFrame:
    if run.rows.empty or "split" not in run.rows:
        return run.rows.iloc[0:0]
    return run.rows[run.rows["split"] == split]


def choose_split(runs: Sequence[Run], requested: str | None) -> tuple[str, list[str]]:
    """The split to analyse (``eval`` when any run has eval rows, else ``train``) and notes on runs left out."""
    split = requested or ("eval" if any(not _split_rows(r, "eval").empty for r in runs) else "train")
    if split not in SPLITS:
        raise UserError(f"--split {split!r}: expected one of {', '.join(SPLITS)}")
    missing = [r.name for r in runs if _split_rows(r, split).empty]
    notes = [f"no {split} rows in {', '.join(missing)}: left out"] if missing else []
    return split, notes


def runs_of_split(runs: Sequence[Run], split: str) -> list[Run]:
    """The runs holding rows of ``split``. For ``eval``, each run's config takes the training settings its
    evaluation rows record, so evaluations of checkpoints group by how the checkpoints were trained."""
    used = []
    for run in runs:
        rows = _split_rows(run, split)
        if rows.empty:
            continue
        if split == "eval":
            run = replace(run, config={**run.config, **constant_columns(rows, TRAINING_COLUMNS)})
        used.append(run)
    return used


def steps_present(runs: Sequence[Run], split: str) -> list[int]:
    return sorted({int(s) for run in runs for s in _split_rows(run, split).get("step", [])})


def evaluation_rows(runs: Sequence[Run], split: str, window: StepWindow, max_turns: int | None = None) -> pd.DataFrame:
    """The rows of ``split`` in ``window`` (and turns 1..max_turns), with ``block`` naming the run and step."""
    frames = []
    for index, run in enumerate(runs):
        rows = _split_rows(run, split)
        if rows.empty:
            continue
        rows = rows[window.mask(rows["step"])]
        if max_turns is not None:
            rows = rows[rows["turn"] <= max_turns]
        frames.append(pd.DataFrame({
            "seed": [repr(run.seed)] * len(rows),
            "block": [f"{index}:{step}" for step in rows["step"]],
            "task_id": rows["task_id"].astype(str).to_numpy(),
            "trajectory": rows["trajectory"].to_numpy(),
            "turn": rows["turn"].astype(int).to_numpy(),
            "correct": rows["correct"].fillna(False).astype(bool).to_numpy(),
            "speedup": pd.to_numeric(rows.get("speedup", pd.Series(index=rows.index, dtype=float)),
                                     errors="coerce").to_numpy(dtype=float),
        }))
    if not frames:
        return pd.DataFrame({c: [] for c in ROW_COLUMNS})
    return pd.concat(frames, ignore_index=True)
