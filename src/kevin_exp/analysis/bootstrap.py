"""Cell values and their 95% percentile-bootstrap intervals over tasks (and seeds, when there are several),
as rliable does for few-run RL results. The RNG seed is fixed, so a table is a pure function of its rows."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BootstrapSettings:
    n_resamples: int = 1000
    rng_seed: int = 0
    level: float = 0.95


@dataclass(frozen=True)
class Estimate:
    value: float
    lo: float
    hi: float


def _quiet_nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN slice: a resampled seed saw none of the tasks
        return np.nanmean(values, axis=axis)


def seeds_then_tasks_mean(matrix: np.ndarray) -> float:
    """Mean over a seed's tasks, then over seeds (seeds x tasks, NaN where a seed never saw a task)."""
    return float(_quiet_nanmean(_quiet_nanmean(matrix, axis=1), axis=0))


def bootstrap(matrix: np.ndarray, settings: BootstrapSettings = BootstrapSettings()) -> Estimate:
    """Resamples tasks (the same draw for every seed, keeping seeds paired on tasks) and, with more than one
    seed, seeds too; each resample is averaged like the point estimate."""
    value = seeds_then_tasks_mean(matrix)
    n_seeds, n_tasks = matrix.shape
    if n_tasks == 0 or settings.n_resamples <= 0:
        return Estimate(value, value, value)
    rng = np.random.default_rng(settings.rng_seed)
    tasks = rng.integers(0, n_tasks, size=(settings.n_resamples, n_tasks))
    if n_seeds > 1:
        seeds = rng.integers(0, n_seeds, size=(settings.n_resamples, n_seeds))
    else:
        seeds = np.zeros((settings.n_resamples, 1), dtype=int)
    resampled = matrix[seeds[:, :, None], tasks[:, None, :]]
    stats = _quiet_nanmean(_quiet_nanmean(resampled, axis=2), axis=1)
    stats = stats[~np.isnan(stats)]
    tail = 100 * (1 - settings.level) / 2
    lo, hi = np.percentile(stats, [tail, 100 - tail])
    return Estimate(value, float(lo), float(hi))
