"""The variant table (Kevin Table 1): per variant, correctness, mean speedup, fast_1 and fast_1.5, each as
best@k and avg@k averaged over tasks and seeds, with a bootstrap interval; plus the table types every view
shares and renders."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from kevin_exp.analysis.bootstrap import BootstrapSettings, bootstrap
from kevin_exp.analysis.scores import seed_task_matrix, task_scores, trajectories_per_task, trajectory_scores
from kevin_exp.analysis.selection import StepWindow, evaluation_rows
from kevin_exp.analysis.variants import Variant


@dataclass(frozen=True)
class Selection:
    split: str
    window: StepWindow
    max_turns: int | None = None
    """Score over turns 1..max_turns only (None: every turn present)."""

    def rows(self, variant: Variant) -> pd.DataFrame:
        return evaluation_rows(variant.runs, self.split, self.window, self.max_turns)


@dataclass(frozen=True)
class Cell:
    value: float
    lo: float | None = None
    hi: float | None = None
    kind: str = "percent"
    """``percent`` (a rate, stored as a fraction) or ``speedup``."""


@dataclass(frozen=True)
class BudgetCell:
    speedup: float
    correct: float


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    key_columns: int = 0
    """How many leading columns name the row (left-aligned) rather than hold numbers."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Metric:
    name: str
    column: str
    """The trajectory-score column (scores.SCORE_COLUMNS)."""
    kind: str


TABLE_METRICS = (
    Metric("correct", "correct", "percent"),
    Metric("speedup", "perf", "speedup"),
    Metric("fast_1", "fast_1", "percent"),
    Metric("fast_1.5", "fast_1.5", "percent"),
)
STATS = ("best", "avg")


def variant_table(variants: Sequence[Variant], selection: Selection,
                  settings: BootstrapSettings = BootstrapSettings(), steps_used: str = "") -> Table:
    """``steps_used`` says which steps of each run the window took (``Analysis.steps_text``)."""
    keys = list(variants[0].values) if variants else []
    metric_columns = [f"{m.name} {stat}@k" for m in TABLE_METRICS for stat in STATS]
    table = Table(title="", columns=[*keys, "k x n", *metric_columns, "tasks", "seeds"], rows=[],
                  key_columns=len(keys) + 1)
    shapes = set()
    for variant in variants:
        rows = selection.rows(variant)
        if rows.empty:
            table.notes.append(f"{variant.label}: no {selection.split} rows in steps {selection.window}")
            continue
        trajectories = trajectory_scores(rows)
        shape = f"{trajectories_per_task(trajectories).max()}x{rows['turn'].max()}"
        shapes.add(shape)
        cells = []
        for metric in TABLE_METRICS:
            per_task = task_scores(trajectories, metric.column)
            for stat in STATS:
                estimate = bootstrap(seed_task_matrix(per_task, stat), settings)
                cells.append(Cell(estimate.value, estimate.lo, estimate.hi, metric.kind))
        table.rows.append([*variant.values.values(), shape, *cells, rows["task_id"].nunique(), rows["seed"].nunique()])
    level = f"{settings.level:.0%}"
    window = f"{selection.window} ({steps_used})" if steps_used else str(selection.window)
    table.title = (f"Variants: {selection.split} split, steps {window}, k trajectories x n turns "
                   f"{'/'.join(sorted(shapes)) or '-'}; mean over tasks then seeds, [{level} bootstrap CI]")
    return table
