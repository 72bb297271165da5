"""The generators by name (``rollout.backend``): ``build_generator`` builds the one a run asks for.

``hf`` samples with Hugging Face ``generate`` (``rollout/generation.py``), ``scripted`` replays the tasks'
reference solutions (``rollout/scripted.py``), ``vllm`` runs a vLLM engine with its own copy of the weights
(``rollout/vllm_engine.py``; vLLM itself is imported only when an engine starts).
"""
from __future__ import annotations

from typing import Callable

import torch

from kevin_exp.config import TrainConfig
from kevin_exp.launch.world import context_from_env
from kevin_exp.models import Policy
from kevin_exp.rollout.generation import Generator, HFGenerator
from kevin_exp.rollout.scripted import ScriptedGenerator
from kevin_exp.rollout.vllm_engine import VLLMGenerator
from kevin_exp.tasks import Problem

# (run settings, policy, task pool, kernel backend, trajectories per task, device) -> generator
GeneratorBuilder = Callable[[TrainConfig, Policy, list[Problem], str, int, torch.device], Generator]


def _hf(cfg: TrainConfig, policy: Policy, tasks: list[Problem], kernel_backend: str, n_trajectories: int,
        device: torch.device) -> Generator:
    ro = cfg.rollout
    return HFGenerator(policy, ro.generation_batch_size, ro.generation_batch_tokens, ro.stop, ro.compile)


def _scripted(cfg: TrainConfig, policy: Policy, tasks: list[Problem], kernel_backend: str, n_trajectories: int,
              device: torch.device) -> Generator:
    return ScriptedGenerator(policy.tokenizer, tasks, kernel_backend, n_trajectories, cfg.rollout.scripted_think_tokens)


def _vllm(cfg: TrainConfig, policy: Policy, tasks: list[Problem], kernel_backend: str, n_trajectories: int,
          device: torch.device) -> Generator:
    return VLLMGenerator(cfg.rollout, cfg.model, policy, context_from_env(), cfg.seed, device, cfg.trainer.dist_timeout_s)


GENERATORS: dict[str, GeneratorBuilder] = {"hf": _hf, "scripted": _scripted, "vllm": _vllm}


def build_generator(cfg: TrainConfig, policy: Policy, tasks: list[Problem], kernel_backend: str,
                    n_trajectories: int, device: torch.device) -> Generator:
    builder = GENERATORS.get(cfg.rollout.backend)
    if builder is None:  # refused at composition already
        raise ValueError(f"rollout.backend={cfg.rollout.backend!r} has no generator")
    return builder(cfg, policy, tasks, kernel_backend, n_trajectories, device)
