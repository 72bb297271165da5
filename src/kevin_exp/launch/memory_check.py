"""The launch-time memory check: a configuration whose estimate (``launch.resources``) does not fit its GPUs, or
the host of a run that trains on the CPU, stops before anything runs (or is submitted), with the numbers and
the changes that would make it fit: settings, more nodes, or a node profile of ``conf/resources`` with more or
larger GPUs."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from kevin_exp.config import TrainConfig
from kevin_exp.launch.resources import MemoryEstimate, MemoryLayout, ResourceError, breakdown, estimate, layout_of

PROFILES_DIR = Path(__file__).resolve().parents[3] / "conf" / "resources"


def local_gpu_memory_gb() -> float | None:
    """The memory of this machine's smallest visible CUDA GPU, in GB; None without one."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / 1e9


def candidate_changes(x: MemoryLayout) -> list[tuple[str, dict[str, Any]]]:
    """Changes that lower the per-GPU estimate, the ones that cost least (in speed, or in GPUs) first."""
    steps: list[tuple[str, dict[str, Any]]] = []
    if not x.sharded:
        steps.append(("trainer.backend=deepspeed (ZeRO-3)", {"backend": "deepspeed", "zero_stage": 3}))
    elif x.zero_stage == 2:
        steps.append(("trainer.zero_stage=3", {"zero_stage": 3}))
    if not x.activation_checkpointing:
        steps.append(("trainer.activation_checkpointing=true", {"activation_checkpointing": True}))
    if x.logprob_tokens > 1024:
        steps.append(("trainer.logprob_chunk_tokens=1024", {"logprob_tokens": 1024}))
    tokens = x.micro_batch_tokens // 2
    while tokens >= 2048:
        steps.append((f"trainer.micro_batch_tokens={tokens}", {"micro_batch_tokens": tokens}))
        tokens //= 2
    batch = x.generation_batch // 2 if not x.vllm_gb else 0  # a vLLM engine's memory is its own setting
    while batch >= 1:
        steps.append((f"rollout.generation_batch_size={batch}", {"generation_batch": batch}))
        batch //= 2
    steps.append(("trainer.offload_optimizer=cpu", {"offload_optimizer": "cpu"}))
    steps.append(("trainer.offload_params=cpu", {"offload_params": "cpu", "zero_stage": 3}))
    per_node = max(1, x.ranks_per_node)
    nodes = x.world_size // per_node
    for more in range(nodes + 1, nodes + 9):
        steps.append((f"resources.nodes={more} ({more * per_node} GPUs)", {"world_size": more * per_node}))
    return steps


def fixes_for(x: MemoryLayout, gpu_budget_gb: float) -> list[str]:
    """The single changes that bring the per-GPU estimate under the budget, each with its estimate; where no
    single change does, the first combination of them (in ``candidate_changes``' order) that does."""
    def with_changes(changes: dict[str, Any]) -> MemoryLayout:
        y = dataclasses.replace(x, **changes)
        return dataclasses.replace(y, logprob_tokens=min(y.logprob_tokens, y.micro_batch_tokens))

    steps = candidate_changes(x)
    singles = []
    for label, changes in steps:
        gb = estimate(with_changes(changes)).per_gpu_gb
        if gb <= gpu_budget_gb and not any(label.split("=")[0] == s.split("=")[0] for s in singles):
            singles.append(f"{label} (about {gb:.0f} GB per GPU)")
    if singles:
        return singles
    # combined: the memory-saving settings first, then more GPUs, then smaller batches
    order = ("trainer.backend", "trainer.zero_stage", "trainer.activation_checkpointing", "trainer.logprob_chunk_tokens",
             "trainer.offload_optimizer", "trainer.offload_params", "resources.nodes", "trainer.micro_batch_tokens",
             "rollout.generation_batch_size")
    chosen: list[tuple[str, dict[str, Any]]] = []

    def combined(steps_: list[tuple[str, dict[str, Any]]]) -> float:
        merged: dict[str, Any] = {}
        for _, changes in steps_:
            merged.update(changes)
        return estimate(with_changes(merged)).per_gpu_gb

    for label, changes in sorted(steps, key=lambda step: order.index(step[0].split("=")[0])):
        key = label.split("=")[0]
        chosen = [c for c in chosen if c[0].split("=")[0] != key] + [(label, changes)]
        if combined(chosen) <= gpu_budget_gb:
            # drop what the combination does not need, the last added first
            for step in list(reversed(chosen)):
                rest = [c for c in chosen if c is not step]
                if combined(rest) <= gpu_budget_gb:
                    chosen = rest
            return [" ".join(lb for lb, _ in chosen) + f" together (about {combined(chosen):.0f} GB per GPU)"]
    return []


def check_resources(cfg: TrainConfig, local_gpu_gb: float | None = None) -> MemoryEstimate:
    """Raises ResourceError naming the numbers and the fixes when the estimate does not fit one GPU or the
    node's host memory. ``local_gpu_gb``: the memory of the GPUs of this machine, where the run trains here; when
    it is less than ``resources.gpu_memory_gb`` the check uses it."""
    x = layout_of(cfg)
    est = estimate(x)
    r = cfg.resources
    measured = local_gpu_gb is not None and local_gpu_gb < r.gpu_memory_gb
    gpu_gb = local_gpu_gb if measured else r.gpu_memory_gb
    budget = gpu_gb * r.max_memory_fraction
    if not r.check:
        return est
    problems = []
    if est.per_gpu_gb > budget:
        fixes = fixes_for(x, budget) + profile_fixes(x, gpu_gb, r.max_memory_fraction) + [
            "resources.check=false to launch anyway"]
        size = (f"this machine's {gpu_gb:.0f} GB GPU; resources.gpu_memory_gb={r.gpu_memory_gb:g} is more than it has"
                if measured else f"resources.gpu_memory_gb={r.gpu_memory_gb:g}")
        problems.append(
            f"model={cfg.model.name} ({cfg.model.params_b:g}B params, {cfg.model.dtype}) does not fit the requested GPUs: "
            f"about {est.per_gpu_gb:.0f} GB per GPU against {budget:.0f} GB usable "
            f"({r.max_memory_fraction:.0%} of {size}) on {x.world_size} GPU(s).\n"
            f"  {breakdown(x, est)}\n  fix: " + "; or ".join(fixes))
    if est.host_per_node_gb > r.mem_gb:
        problems.append(
            f"the host memory of one node does not fit: about {est.host_per_node_gb:.0f} GB against resources.mem_gb="
            f"{r.mem_gb} ({x.ranks_per_node} ranks: offloaded states {est.host_offload_gb:.0f} GB, model loading "
            f"{est.host_load_gb:.0f} GB, processes {est.host_processes_gb:.0f} GB, evaluator {est.host_evaluator_gb:.0f} GB).\n"
            "  fix: more host memory (resources.mem_gb), no offload (trainer.offload_optimizer=none), fewer cores per "
            "rank for compiles (resources.cpus_per_task), or more nodes (resources.nodes)")
    if problems:
        raise ResourceError("\n".join(problems))
    return est


def node_profiles() -> dict[str, tuple[int, float]]:
    """Each GPU profile of ``conf/resources``: (GPUs per node, GB per GPU), fewest and smallest first."""
    base = OmegaConf.load(PROFILES_DIR / "gpu1.yaml")
    profiles = {}
    for path in sorted(PROFILES_DIR.glob("*.yaml")):
        node = OmegaConf.merge(base, OmegaConf.load(path))
        if int(node.gpus_per_node) > 0:
            profiles[path.stem] = (int(node.gpus_per_node), float(node.gpu_memory_gb))
    return dict(sorted(profiles.items(), key=lambda item: (item[1][0], item[1][1])))


def profile_fixes(x: MemoryLayout, gpu_memory_gb: float, fraction: float) -> list[str]:
    """The first node profile other than the run's own whose GPUs hold it under ZeRO-3, one rank per GPU
    (``trainer=deepspeed`` resolves its layout for them), with the estimate there."""
    for name, (gpus, gb) in node_profiles().items():
        if (gpus, gb) == (x.ranks_per_node, gpu_memory_gb):
            continue
        sharded = dataclasses.replace(x, backend="deepspeed", zero_stage=3, world_size=gpus, ranks_per_node=gpus,
                                      micro_batch_tokens=min(x.micro_batch_tokens, x.sequence_tokens),
                                      logprob_tokens=min(x.logprob_tokens, 1024), activation_checkpointing=True)
        # the layouts trainer=deepspeed's auto resolution tries, fastest first
        for offloads in ({}, {"offload_optimizer": "cpu"}, {"offload_optimizer": "cpu", "offload_params": "cpu"}):
            per_gpu = estimate(dataclasses.replace(sharded, **offloads)).per_gpu_gb
            if per_gpu <= gb * fraction:
                trainer = "" if x.sharded else "trainer=deepspeed "
                where = ", optimizer states on the CPU" if offloads else ""
                return [f"{trainer}resources={name} ({gpus} GPUs of {gb:g} GB{where}: about {per_gpu:.0f} GB per GPU)"]
    return []


def host_memory_gb() -> float:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9


def check_host_training(cfg: TrainConfig) -> MemoryEstimate | None:
    """A run that trains on this machine's CPU holds the policy's weights, gradients and optimizer states in
    host memory: refused (``ResourceError``) when they and the run's process cannot fit it.
    ``resources.check=false`` skips the check."""
    if not cfg.resources.check:
        return None
    x = layout_of(cfg)
    est = estimate(x)
    # what the run holds for certain: the states and its process. The activations' estimate assumes every
    # sequence at its longest, which short CPU runs never reach, so it would refuse runs that fit.
    need = est.states_gb + est.host_processes_gb
    have = host_memory_gb() * cfg.resources.max_memory_fraction
    if need > have:
        raise ResourceError(
            f"model={cfg.model.name} ({cfg.model.params_b:g}B params, {cfg.model.dtype}) trains on the CPU here "
            f"(trainer.device={cfg.trainer.device}{': no GPU is visible' if cfg.trainer.device == 'auto' else ''}) and "
            f"does not fit this machine's memory: its states and process alone take about {need:.0f} GB "
            f"against {have:.0f} GB usable ({cfg.resources.max_memory_fraction:.0%} of {host_memory_gb():.0f} GB).\n"
            f"  {breakdown(x, est)} (in host memory here)\n  fix: a smaller model (model=tiny, model=smollm2_135m), a machine with a GPU "
            "(trainer.device=cuda there), or resources.check=false to launch anyway")
    return est
