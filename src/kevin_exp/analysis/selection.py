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


def steps_text(steps: Sequence[int]) -> str:
    steps = sorted(steps)
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}..{steps[-1]}"


def completeness_notes(run: Run) -> list[str]:
    """What a run's records lack: lines a kill cut (not read), and steps short of the planned ones."""
    notes = [f"{run.name}: {file} has {n} unreadable line{'s' if n > 1 else ''} at its end (a write cut short); "
             "the rows before them are used" for file, n in run.unreadable.items()]
    finished = run.finished_train_steps()
    planned = run.planned_steps
    trained = not _split_rows(run, "train").empty
    if trained and finished is not None and planned is not None and max(finished, default=0) < planned:
        notes.append(f"{run.name}: unfinished, {max(finished, default=0)} of {planned} training steps")
    return notes


def leave_out_partial_steps(runs: Sequence[Run], split: str, keep: bool = False) -> tuple[list[Run], list[str]]:
    """Each run with the training steps it did not finish (turn rows without the step's metrics row: the run
    stopped inside the step) left out of ``split``'s rows, unless ``keep``; and a note naming them."""
    if split != "train":
        return list(runs), []
    kept, notes = [], []
    for run in runs:
        finished = run.finished_train_steps()
        train = _split_rows(run, "train")
        partial = sorted({int(s) for s in train.get("step", [])} - finished) if finished is not None else []
        if partial and not keep:
            drop = (run.rows["split"] == "train") & run.rows["step"].isin(partial)
            run = replace(run, rows=run.rows[~drop])
            notes.append(f"{run.name}: step {steps_text(partial)} unfinished (turn rows without the step's metrics "
                         "row: the run stopped inside it): left out (--include-partial keeps it)")
        elif partial:
            notes.append(f"{run.name}: step {steps_text(partial)} unfinished: included (--include-partial)")
        kept.append(run)
    return kept, notes


def steps_used(runs: Sequence[Run], split: str, window: StepWindow) -> dict[str, list[int]]:
    """The steps of ``split`` each run contributes to ``window``."""
    used = {}
    for run in runs:
        rows = _split_rows(run, split)
        if not rows.empty:
            used[run.name] = sorted({int(s) for s in rows["step"][window.mask(rows["step"])]})
    return used


def steps_used_text(used: dict[str, list[int]]) -> str:
    """``step 8`` when every run contributes the same steps, else each run's."""
    distinct = {tuple(steps) for steps in used.values()}
    if len(distinct) == 1:
        [steps] = distinct
        return f"step{'s' if len(steps) > 1 else ''} {steps_text(steps)} of every run"
    return "; ".join(f"{name}: {steps_text(steps) or 'none'}" for name, steps in used.items())


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
