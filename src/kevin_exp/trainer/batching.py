"""How one step's samples are cut into gradient steps and micro-batches when they are spread over ranks.

Mini-batches are drawn over the whole step (every rank's samples, numbered rank by rank), with the same
seeded shuffle the single-process learner uses, so a world of N ranks takes the very gradient steps one rank
would take on the whole batch; each rank then runs the members it holds.
"""
from __future__ import annotations

import random
from typing import Sequence


def minibatch_plan(total: int, minibatches: int, epochs: int, seed: int) -> list[list[int]]:
    """The global sample indices of each gradient step, in order (``TorchLearner``'s split)."""
    order = list(range(total))
    rng = random.Random(seed)
    plan = []
    for _ in range(epochs):
        rng.shuffle(order)
        n_mb = min(minibatches, len(order))
        plan.extend(order[mb::n_mb] for mb in range(n_mb))
    return plan


def token_micro_batches(indices: Sequence[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    """``indices`` (in order) cut into runs whose padded size (sequences x longest) fits ``budget`` tokens;
    a sequence longer than the budget runs alone."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in indices:
        grown = max(longest, lengths[i])
        if current and (len(current) + 1) * grown > budget:
            out.append(current)
            current, grown = [], lengths[i]
        current.append(i)
        longest = grown
    if current:
        out.append(current)
    return out
