"""Kevin's per-trajectory and per-task scores (section 5, Table 1).

A trajectory is correct if any of its kernels is; its performance is the speedup of its fastest correct kernel,
0.0 when it has none; fast_p is 1 when it holds a correct kernel with speedup >= p (Kevin's ">=", where
KernelBench's fastp uses ">"). Over a task's k trajectories best@k is the max and avg@k the mean."""
from __future__ import annotations

import numpy as np
import pandas as pd

from kevin_exp.analysis.estimators import expected_max_of_k

FAST_THRESHOLDS = (1.0, 1.5)
TRAJECTORY_KEYS = ["seed", "block", "task_id", "trajectory"]
TASK_KEYS = ["seed", "block", "task_id"]


def fast_column(p: float) -> str:
    return f"fast_{p:g}"


SCORE_COLUMNS = ("correct", "perf", *(fast_column(p) for p in FAST_THRESHOLDS))


def trajectory_scores(rows: pd.DataFrame, max_turns: int | None = None) -> pd.DataFrame:
    """One row per trajectory, scored over its turns 1..max_turns (a trajectory with fewer turns, as in a
    truncated run, is scored over the turns it has)."""
    if max_turns is not None:
        rows = rows[rows["turn"] <= max_turns]
    correct = rows["correct"].to_numpy(dtype=bool)
    # a correct kernel whose timing is missing counts as correct with speedup 0
    speedup = np.where(correct, np.nan_to_num(rows["speedup"].to_numpy(dtype=float), nan=0.0), 0.0)
    scored = rows[TRAJECTORY_KEYS].copy()
    scored["correct"] = correct.astype(float)
    scored["perf"] = speedup
    for p in FAST_THRESHOLDS:
        scored[fast_column(p)] = (correct & (speedup >= p)).astype(float)
    scored["turns"] = rows["turn"].to_numpy()
    grouped = scored.groupby(TRAJECTORY_KEYS, sort=True)
    out = grouped[list(SCORE_COLUMNS)].max()
    out["turns"] = grouped["turns"].max()
    return out.reset_index()


def task_scores(trajectories: pd.DataFrame, column: str, k: int | None = None) -> pd.DataFrame:
    """Per (seed, task): best@k and avg@k of ``column``, each the mean over the task's evaluation blocks.

    ``k=None`` uses all of a task's trajectories (best = max); a smaller k uses the unbiased expected max of k
    of them; a task with fewer than k trajectories uses all it has."""
    def best(values: pd.Series) -> float:
        n = len(values)
        return float(values.max()) if k is None or k >= n else expected_max_of_k(values.to_numpy(), k)

    per_block = trajectories.groupby(TASK_KEYS, sort=True)[column].agg(best=best, avg="mean").reset_index()
    return per_block.groupby(["seed", "task_id"], sort=True)[["best", "avg"]].mean().reset_index()


def seed_task_matrix(per_task: pd.DataFrame, column: str) -> np.ndarray:
    """Seeds x tasks (NaN where a seed never saw the task), the input of the point estimate and bootstrap."""
    return per_task.pivot(index="seed", columns="task_id", values=column).to_numpy(dtype=float)


def trajectories_per_task(trajectories: pd.DataFrame) -> pd.Series:
    return trajectories.groupby(TASK_KEYS).size()
