"""Advantage estimators, selected by name from a small registry.

Samples are per turn. ``group`` is the task a sample belongs to in this step; ``turn`` is its turn index.
- ``grpo`` (Kevin section 4, step 4): the group is all trajectories x turns of one task; (R - mean) / std,
  or R - mean when ``scale_by_std`` is off (Dr. GRPO).
- ``trloo`` (Dr. Kernel): per (task, turn) leave-one-out baseline, R_i - mean of the *other* samples of the
  same task and turn; no std.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable, Hashable, Sequence

Estimator = Callable[..., list[float]]
_REGISTRY: dict[str, Estimator] = {}


def register(name: str) -> Callable[[Estimator], Estimator]:
    def wrap(fn: Estimator) -> Estimator:
        _REGISTRY[name] = fn
        return fn

    return wrap


def get_estimator(name: str) -> Estimator:
    if name not in _REGISTRY:
        raise ValueError(f"advantage estimator {name!r}: unknown; choose from {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def estimators() -> list[str]:
    return sorted(_REGISTRY)


def _groups(keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        out[k].append(i)
    return out


@register("grpo")
def grpo(
    returns: Sequence[float],
    group: Sequence[Hashable],
    turn: Sequence[int] | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    adv = [0.0] * len(returns)
    for idx in _groups(group).values():
        vals = [float(returns[i]) for i in idx]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))  # population std, as TRL/verl
        for i, v in zip(idx, vals):
            adv[i] = (v - mean) / (std + eps) if scale_by_std else v - mean
    return adv


@register("trloo")
def trloo(
    returns: Sequence[float],
    group: Sequence[Hashable],
    turn: Sequence[int] | None = None,
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> list[float]:
    if turn is None:
        raise ValueError("trloo needs the turn index of every sample")
    adv = [0.0] * len(returns)
    for idx in _groups(list(zip(group, turn))).values():
        n = len(idx)
        total = sum(float(returns[i]) for i in idx)
        for i in idx:
            adv[i] = 0.0 if n == 1 else float(returns[i]) - (total - float(returns[i])) / (n - 1)
    return adv
