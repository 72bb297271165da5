"""The parts a training run and an evaluation run share, built once from the typed config: the task pool,
the policy and its prompt encoding, the generator, the environment that scores responses, and the run
folder's records (turns, metrics, transcripts, provenance, the metric logger)."""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from kevin_exp.config import TrainConfig
from kevin_exp.metric_logger import MetricLogger, build_metric_logger
from kevin_exp.models import Policy, chat_prompt_ids, load_policy
from kevin_exp.records import RunRecords, run_id_for
from kevin_exp.rollout.env import Environment
from kevin_exp.rollout.generation import Generator, build_generator
from kevin_exp.tasks import Problem
from kevin_exp.trainer.setup import build_environment, load_task_pool, resolve_device
from kevin_exp.transcripts import TranscriptWriter


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


@dataclass
class RunFolder:
    """Where a run's records go; opened before the model loads so a resume can be refused early."""

    path: Path
    run_id: str
    records: RunRecords
    transcripts: TranscriptWriter

    @classmethod
    def at(cls, run_dir: str | Path) -> "RunFolder":
        path = Path(run_dir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, run_id_for(path), RunRecords(path), TranscriptWriter(path))

    def open(self, cfg: TrainConfig, start_step: int) -> None:
        resolved = provenance_config(cfg)
        self.records.write_provenance(resolved, yaml_of(resolved), start_step)
        self.records.open()

    def close(self) -> None:
        self.records.close()
        self.transcripts.close()


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
    policy = load_policy(cfg.model, device)
    tok = policy.tokenizer
    env = build_environment(cfg, vocab_size=len(tok))
    n_trajectories = cfg.eval.n_trajectories if evaluation else cfg.n_trajectories
    return PolicyParts(
        pool=pool, device=device, policy=policy,
        generator=build_generator(cfg.rollout, policy, pool, env.backend, n_trajectories), env=env,
        encode_prompt=lambda text: chat_prompt_ids(tok, text, cfg.model.system_prompt),
        count_tokens=lambda text: len(tok.encode(text, add_special_tokens=False)),
    )


def build_logger(cfg: TrainConfig, folder: RunFolder, sweep: str | None) -> MetricLogger:
    return build_metric_logger(cfg.logger, folder.path, folder.run_id, experiment=cfg.experiment, sweep=sweep,
                               config=provenance_config(cfg))


def provenance_config(cfg: TrainConfig) -> dict[str, Any]:
    """The settings the run used (after aliases were reconciled), as written to config.json and W&B."""
    return dataclasses.asdict(cfg)


def yaml_of(resolved: dict[str, Any]) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(resolved))
