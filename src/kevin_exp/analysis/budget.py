"""The fixed-budget view (Kevin Table 2): a budget of B kernels per task spent as k parallel trajectories x n
serial turns (16x8, 32x4, 128x1 for B = 128); each cell is best@k performance / best@k correctness over the
first n turns, using the unbiased best-of-k estimate where the data has more than k trajectories."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kevin_exp.analysis.bootstrap import seeds_then_tasks_mean
from kevin_exp.analysis.scores import seed_task_matrix, task_scores, trajectories_per_task, trajectory_scores
from kevin_exp.analysis.tables import BudgetCell, Selection, Table
from kevin_exp.analysis.variants import Variant


@dataclass(frozen=True)
class BudgetSplit:
    trajectories: int
    turns: int

    @property
    def label(self) -> str:
        return f"{self.trajectories}x{self.turns}"


def budget_splits(budget: int, max_turns: int) -> list[BudgetSplit]:
    """Every k x n = budget with n <= max_turns, most turns first (the paper's column order)."""
    if budget < 1:
        raise ValueError(f"--budget {budget}: expected a positive number of kernels per task")
    return [BudgetSplit(budget // n, n) for n in range(min(budget, max_turns), 0, -1) if budget % n == 0]


def _why_unsupported(split: BudgetSplit, turns: int, trajectories: int) -> str | None:
    if split.turns > turns:
        return f"needs {split.turns} turns, the data has {turns}"
    if split.trajectories > trajectories:
        return f"needs {split.trajectories} trajectories per task, the data has {trajectories}"
    return None


def budget_table(variants: Sequence[Variant], selection: Selection, budget: int) -> Table:
    keys = list(variants[0].values) if variants else []
    data = []
    for variant in variants:
        rows = selection.rows(variant)
        if rows.empty:
            continue
        # the split must hold for every task, so the scarcest task decides
        data.append((variant, rows, int(rows["turn"].max()), int(trajectories_per_task(trajectory_scores(rows)).min())))
    candidates = budget_splits(budget, max((turns for *_, turns, _ in data), default=0))
    cells: dict[tuple[int, str], BudgetCell] = {}
    skipped: dict[tuple[str, str], list[str]] = {}
    for index, (variant, rows, turns, trajectories) in enumerate(data):
        for split in candidates:
            reason = _why_unsupported(split, turns, trajectories)
            if reason:
                skipped.setdefault((split.label, reason), []).append(variant.label)
                continue
            scored = trajectory_scores(rows, split.turns)
            perf = task_scores(scored, "perf", split.trajectories)
            correct = task_scores(scored, "correct", split.trajectories)
            cells[index, split.label] = BudgetCell(seeds_then_tasks_mean(seed_task_matrix(perf, "best")),
                                                   seeds_then_tasks_mean(seed_task_matrix(correct, "best")))
    shown = [s.label for s in candidates if any((i, s.label) in cells for i in range(len(data)))]
    table = Table(title=f"Fixed budget of {budget} kernels per task ({selection.split} split, steps "
                        f"{selection.window}): best@k speedup / best@k correctness, k trajectories x n turns",
                  columns=[*keys, *shown], rows=[], key_columns=len(keys))
    for (label, reason), skipped_variants in skipped.items():
        which = "" if len(skipped_variants) == len(data) else f" for {'; '.join(skipped_variants)}"
        table.notes.append(f"{label} skipped{which}: {reason}")
    for index, (variant, *_) in enumerate(data):
        table.rows.append([*variant.values.values(), *(cells.get((index, label)) for label in shown)])
    if not candidates:
        table.notes.append("no rows to split the budget over")
    return table
