"""Building the run's components from its config, with errors that name the key and the fix."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from kevin_exp.config import TasksConfig, TrainConfig
from kevin_exp.errors import UserError
from kevin_exp.tasks import Problem, load_builtin, load_kernelbench, select
from kevin_exp.tasks.splits import apply_split
from kevin_exp.threads import thread_count


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name}: no CUDA GPU is visible here; use trainer.device=auto or cpu")
    return torch.device(name)


class TaskPoolError(UserError):
    """The tasks settings select nothing usable; the message names the key and the fix."""


def load_task_pool(cfg: TasksConfig) -> list[Problem]:
    if cfg.suite == "builtin":
        pool = load_builtin(cfg.levels)
    elif cfg.suite == "kernelbench":
        if not cfg.kernelbench_path:
            raise TaskPoolError("tasks.suite=kernelbench needs tasks.kernelbench_path=/path/to/KernelBench")
        if not Path(cfg.kernelbench_path).is_dir():
            raise TaskPoolError(
                f"tasks.kernelbench_path={cfg.kernelbench_path}: no such folder; point it at a KernelBench checkout "
                "(the folder holding KernelBench/level1 ...)"
            )
        try:
            pool = load_kernelbench(cfg.kernelbench_path, cfg.levels)
        except (FileNotFoundError, ValueError) as e:
            raise TaskPoolError(f"tasks.kernelbench_path={cfg.kernelbench_path}: {e}") from None
    else:
        raise TaskPoolError(f"tasks.suite={cfg.suite!r}: expected builtin or kernelbench")
    try:
        pool = apply_split(pool, cfg.split)
    except ValueError as e:
        raise TaskPoolError(str(e)) from None
    if cfg.ids:
        pool = select(pool, cfg.ids)
    if not pool:
        raise TaskPoolError(f"no tasks selected (tasks.suite={cfg.suite}, levels={list(cfg.levels)}, split={cfg.split}, "
                            f"ids={list(cfg.ids)})")
    return pool


def build_environment(cfg: TrainConfig, vocab_size: int):
    from kevin_exp.rollout.env import KernelEnv, ScoreWeights, SyntheticEnv

    if cfg.rollout.env == "synthetic":
        return SyntheticEnv(target_below=max(1, vocab_size // 8))
    if cfg.rollout.env != "kernel":
        raise ValueError(f"rollout.env={cfg.rollout.env!r}: expected kernel or synthetic")
    from kevin_exp.bench.evaluator import Evaluator

    evaluator = Evaluator(dataclasses.replace(cfg.evaluator.to_bench(), cpus=thread_count(cfg.resources)))
    weights = ScoreWeights(cfg.algorithm.correctness_weight, cfg.algorithm.speedup_weight)
    return KernelEnv(evaluator, weights)
