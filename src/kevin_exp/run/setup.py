"""Building the run's components from its config, with errors that name the key and the fix."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Iterator

import torch

from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.bench.remote import RemoteEvaluator, RemoteSettings
from kevin_exp.config import ConfigError, TasksConfig, TrainConfig
from kevin_exp.errors import UserError
from kevin_exp.launch.threads import thread_count
from kevin_exp.launch.world import context_from_env
from kevin_exp.rollout.env import KernelEnv, ScoreWeights, SyntheticEnv
from kevin_exp.tasks import Problem, load_builtin, load_kernelbench, select
from kevin_exp.tasks.splits import apply_split


def resolve_device(name: str) -> torch.device:
    """``auto`` and ``cuda`` are this rank's GPU in a multi-rank run (``cuda:LOCAL_RANK``, or ``cuda:0`` when
    it is the only one visible)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name}: no CUDA GPU is visible on this machine; use trainer.device=auto "
                          "(cuda when a GPU is visible, else cpu) or trainer.device=cpu")
    ctx = context_from_env()
    if name == "cuda" and ctx.distributed:
        # a launcher that shows each rank only its own GPU leaves it as cuda:0
        return torch.device("cuda", 0 if torch.cuda.device_count() == 1 else ctx.local_rank)
    return torch.device(name)


@contextlib.contextmanager
def rank_gpu_visible() -> Iterator[None]:
    """While the evaluator is built: only this rank's GPU is visible to it (it gives its run slots the visible
    GPUs), so rank r times its kernels on GPU r alone. This process's own CUDA context is not affected."""
    ctx = context_from_env()
    if not ctx.distributed or not torch.cuda.is_available():
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d.strip() for d in before.split(",") if d.strip()] if before else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[ctx.local_rank % len(visible)]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


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
    elif cfg.suite == "kernel_menu":
        from kevin_exp.tasks.kernel_menu import load_menu

        pool = load_menu(cfg.levels)
    else:
        raise TaskPoolError(f"tasks.suite={cfg.suite!r}: expected builtin, kernelbench or kernel_menu")
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
    if cfg.rollout.env == "synthetic":
        return SyntheticEnv(target_below=max(1, vocab_size // 8))
    if cfg.rollout.env != "kernel":
        raise ValueError(f"rollout.env={cfg.rollout.env!r}: expected kernel or synthetic")
    weights = score_weights(cfg)
    if cfg.evaluator.placement == "remote":
        r = cfg.evaluator.remote
        log_dir = r.log_dir or str(Path(cfg.run_dir or ".") / "evaluator-workers")
        settings = RemoteSettings(**{**dataclasses.asdict(r), "job_extra": tuple(r.job_extra), "log_dir": log_dir})
        # each worker's evaluator uses its own job's cores
        return kernel_env(cfg, RemoteEvaluator(dataclasses.replace(cfg.evaluator.to_bench(), cpus=r.cores), settings), weights)
    # this rank's share of the node's cores (thread_count splits them among the node's ranks)
    with rank_gpu_visible():
        evaluator = Evaluator(dataclasses.replace(cfg.evaluator.to_bench(), cpus=thread_count(cfg.resources)))
    return kernel_env(cfg, evaluator, weights)


def score_weights(cfg: TrainConfig) -> ScoreWeights:
    """The reward's settings of a run: the weights and the cap, all under ``algorithm``."""
    return ScoreWeights(cfg.algorithm.correctness_weight, cfg.algorithm.speedup_weight, cfg.algorithm.max_speedup)


def kernel_env(cfg: TrainConfig, evaluator, weights):
    """The evaluator-backed environment of the run's task suite."""

    if cfg.tasks.suite == "kernel_menu":
        from kevin_exp.rollout.menu_env import MenuEnv

        return MenuEnv(evaluator, weights, feedback=cfg.tasks.menu_feedback)
    return KernelEnv(evaluator, weights)
