"""The parts a training run and an evaluation run share, built once from the typed config: the task pool,
the policy and its prompt encoding, the generator, the environment that scores responses, and the metric
logger beside the run folder's records (``run/folder.py``)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kevin_exp.config import TrainConfig
from kevin_exp.models import Policy, chat_prompt_ids, load_policy
from kevin_exp.records.metric_logger import MetricLogger, RecordsOnly, build_metric_logger
from kevin_exp.rollout.env import Environment
from kevin_exp.rollout.generation import Generator
from kevin_exp.rollout.generators import build_generator
from kevin_exp.run.folder import RunFolder, provenance_config
from kevin_exp.run.setup import build_environment, load_task_pool, resolve_device
from kevin_exp.tasks import Problem


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@dataclass
class PolicyParts:
    pool: list[Problem]
    device: torch.device
    policy: Policy
    generator: Generator
    env: Environment
    encode_prompt: Callable[[str], list[int]]
    count_tokens: Callable[[str], int]


def build_policy_parts(cfg: TrainConfig, evaluation: bool = False) -> PolicyParts:
    seed_everything(cfg.seed)
    pool = load_task_pool(cfg.tasks)
    device = resolve_device(cfg.trainer.device)
    # a ZeRO-3 learner beside an engine with its own weights only reads the whole model once, to fill its
    # partitioned copy: it stays off the GPU, which the engine must find free when it starts
    whole_on_host = cfg.rollout.backend == "vllm" and cfg.trainer.backend == "deepspeed" and cfg.trainer.zero_stage == 3
    policy = load_policy(cfg.model, torch.device("cpu") if whole_on_host else device)
    tok = policy.tokenizer
    env = build_environment(cfg, vocab_size=len(tok))
    n_trajectories = cfg.eval.n_trajectories if evaluation else cfg.n_trajectories
    return PolicyParts(
        pool=pool, device=device, policy=policy,
        generator=build_generator(cfg, policy, pool, env.backend, n_trajectories, device), env=env,
        encode_prompt=lambda text: chat_prompt_ids(tok, text, cfg.model.system_prompt),
        count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)),
    )


def build_logger(cfg: TrainConfig, folder: RunFolder, sweep: str | None) -> MetricLogger:
    if not folder.main:
        return RecordsOnly()  # one W&B run per run, rank 0's
    return build_metric_logger(cfg.logger, folder.path, folder.run_id, experiment=cfg.experiment, sweep=sweep,
                               config=provenance_config(cfg))
