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
from kevin_exp.errors import UserError

LISTED_BUDGETS = 12
"""A shortfall note lists the supported budgets when there are at most this many."""


@dataclass(frozen=True)
class BudgetSplit:
    trajectories: int
    turns: int

    @property
    def label(self) -> str:
        return f"{self.trajectories}x{self.turns}"


def check_budget(budget: int) -> None:
    if budget < 1:
        raise UserError(f"--budget {budget}: expected a positive number of kernels per task")


def budget_splits(budget: int, max_turns: int) -> list[BudgetSplit]:
    """Every k x n = budget with n <= max_turns, most turns first (the paper's column order)."""
    check_budget(budget)
    return [BudgetSplit(budget // n, n) for n in range(min(budget, max_turns), 0, -1) if budget % n == 0]


def supported_budgets(trajectories: int, turns: int) -> list[int]:
    """The budgets k x n with k <= trajectories and n <= turns."""
    return sorted({k * n for k in range(1, trajectories + 1) for n in range(1, turns + 1)})


def _why_unsupported(split: BudgetSplit, turns: int, trajectories: int) -> str | None:
    if split.turns > turns:
        return f"needs {split.turns} turns, the data has {turns}"
    if split.trajectories > trajectories:
        return f"needs {split.trajectories} trajectories per task, the data has {trajectories}"
    return None


def _count(n: int, singular: str, plural: str) -> str:
    return f"{n} {singular if n == 1 else plural}"


def shortfall_note(budget: int, runs: Sequence[str], trajectories: int, turns: int, of: int) -> str:
    """Why none of ``runs``' rows (``of`` runs in all) can be spent as ``budget`` kernels per task, and what
    they can be spent as."""
    one = len(runs) == 1
    # run directories of a sweep are named like "gamma=0.4,seed=0", hence "; " between names
    names = f"all {of} runs" if len(runs) == of > 1 else "; ".join(runs)
    holds, supports = ("holds", "it supports") if one else ("hold", "they support")
    shape = f"{_count(trajectories, 'trajectory', 'trajectories')} x {_count(turns, 'turn', 'turns')}"
    held = trajectories * turns
    budgets = supported_budgets(trajectories, turns)
    listed = ", ".join(map(str, budgets)) if len(budgets) <= LISTED_BUDGETS else f"any k x n up to {held}"
    supported = f"budgets {supports} (k <= {trajectories}, n <= {turns}): {listed}"
    if budget > held:
        return f"--budget {budget} is more than {names} {holds}: {shape} = {held} kernels per task; {supported}"
    return (f"--budget {budget} does not split into k trajectories x n turns that {names} {holds} ({shape} per "
            f"task); {supported}")


def budget_table(variants: Sequence[Variant], selection: Selection, budget: int) -> Table:
    """One row per variant with rows; a variant that fits no split of the budget gets a note instead of cells
    (the table has no budget column when no variant fits one)."""
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
    short: dict[tuple[int, int], list[str]] = {}
    skipped: dict[tuple[str, str], list[str]] = {}
    for index, (variant, rows, turns, trajectories) in enumerate(data):
        reasons = {split.label: _why_unsupported(split, turns, trajectories) for split in candidates}
        if all(reasons.values()):
            short.setdefault((trajectories, turns), []).extend(run.name for run in variant.runs)
            continue
        for split in candidates:
            if reasons[split.label]:
                skipped.setdefault((split.label, reasons[split.label]), []).append(variant.label)
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
    every = sum(len(variant.runs) for variant, *_ in data)
    for (trajectories, turns), runs in short.items():
        table.notes.append(shortfall_note(budget, runs, trajectories, turns, every))
    for (label, reason), skipped_variants in skipped.items():
        which = "" if len(skipped_variants) == len(data) else f" for {'; '.join(skipped_variants)}"
        table.notes.append(f"{label} skipped{which}: {reason}")
    if shown:
        for index, (variant, *_) in enumerate(data):
            table.rows.append([*variant.values.values(), *(cells.get((index, label)) for label in shown)])
    if not data:
        table.notes.append("no rows to split the budget over")
    return table
