"""Per-turn credit for one step's samples: discounted returns within each trajectory, then advantages
within each task's group (all trajectories x turns of that task, Kevin section 4 step 4)."""
from __future__ import annotations

from collections import defaultdict
from typing import Hashable, Sequence

from kevin_exp.rl.advantages import get_estimator
from kevin_exp.rl.returns import discounted_returns


def turn_credit(
    scores: Sequence[float],
    task: Sequence[Hashable],
    trajectory: Sequence[Hashable],
    turn: Sequence[int],
    gamma: float,
    aggregation: str = "sum",
    estimator: str = "grpo",
    scale_by_std: bool = True,
) -> tuple[list[float], list[float]]:
    """Returns (returns, advantages), one per sample, in the input order."""
    by_trajectory: dict[tuple[Hashable, Hashable], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(task, trajectory)):
        by_trajectory[key].append(i)
    returns = [0.0] * len(scores)
    for idx in by_trajectory.values():
        idx.sort(key=lambda i: turn[i])
        for i, r in zip(idx, discounted_returns([scores[i] for i in idx], gamma, aggregation)):
            returns[i] = r
    advantages = get_estimator(estimator)(returns, list(task), turn=list(turn), scale_by_std=scale_by_std)
    return returns, advantages
