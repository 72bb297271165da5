"""The learners by name (``trainer.backend``): ``build_learner`` builds the one a run asks for.

``torch`` trains in this process with AdamW (``trainer/learner.py``); ``deepspeed`` trains under ZeRO over every
rank of the run (``trainer/deepspeed_learner.py``; DeepSpeed itself is imported only when a learner starts).
"""
from __future__ import annotations

from typing import Callable

import torch

from kevin_exp.config import TrainConfig
from kevin_exp.trainer.deepspeed_learner import DeepSpeedLearner
from kevin_exp.trainer.learner import Learner, TorchLearner

# (run settings, model, pad token id, device, load_universal) -> learner
LearnerBuilder = Callable[[TrainConfig, torch.nn.Module, int, torch.device, bool], Learner]


def _torch(cfg: TrainConfig, model: torch.nn.Module, pad_id: int, device: torch.device, load_universal: bool) -> Learner:
    return TorchLearner(model, pad_id, cfg.trainer, cfg.algorithm, cfg.rollout.max_new_tokens, cfg.steps, device,
                        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, normalization=cfg.normalization)


def _deepspeed(cfg: TrainConfig, model: torch.nn.Module, pad_id: int, device: torch.device,
               load_universal: bool) -> Learner:
    return DeepSpeedLearner(model, pad_id, cfg.trainer, cfg.algorithm, cfg.rollout.max_new_tokens, cfg.steps, device,
                            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, run_dir=cfg.run_dir,
                            load_universal=load_universal,
                            # an engine with its own weights (rollout=vllm) needs no whole copy beside ZeRO-3's
                            keep_generator_copy=cfg.rollout.backend != "vllm", normalization=cfg.normalization)


LEARNERS: dict[str, LearnerBuilder] = {"torch": _torch, "deepspeed": _deepspeed}


def build_learner(cfg: TrainConfig, model: torch.nn.Module, pad_id: int, device: torch.device,
                  load_universal: bool = False) -> Learner:
    """``load_universal``: the checkpoint to resume from was written by another number of ranks (deepspeed)."""
    builder = LEARNERS.get(cfg.trainer.backend)
    if builder is None:  # refused at composition already
        raise ValueError(f"trainer.backend={cfg.trainer.backend!r} has no learner")
    return builder(cfg, model, pad_id, device, load_universal)
