"""The ``logger`` and ``resources`` groups: where records go and what a job asks for (launch settings:
they never change results)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kevin_exp.settings_checks import choice, number


@dataclass
class LoggerConfig:
    # jsonl (records only) | wandb (records + Weights & Biases)
    kind: str = choice("jsonl", ("jsonl", "wandb"))
    # auto: a live bar on a terminal, plain periodic lines otherwise (SLURM logs)
    progress: str = choice("auto", ("auto", "bar", "lines", "none"))
    # W&B: project, entity (team; null = your default), group (null = the sweep's name), extra tags
    project: str = "kevin-exp"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    # auto: online when an API key is found (WANDB_API_KEY or ~/.netrc), offline otherwise | online | offline | disabled
    mode: str = choice("auto", ("auto", "online", "offline", "disabled"))


@dataclass
class ResourcesConfig:
    """What a job asks for (a launch setting: it never changes results, nor the job's directory)."""

    nodes: int = number(1, ge=1)
    gpus_per_node: int = number(1, ge=0)
    # memory of one GPU (H100 80 GB; H200 141 GB)
    gpu_memory_gb: float = number(80.0, ge=0)
    # processes per node, one per GPU (each a rank of the run; SLURM's tasks_per_node); on a CPU-only node
    # the number of CPU ranks (gloo). The YAML default is gpus_per_node (1 without GPUs)
    ranks_per_node: int = number(1, ge=1)
    # cores of one rank (SLURM's cpus_per_task): its torch/OpenMP threads and its evaluator's compile and run
    # workers, at most the cores it may use shared with the node's other ranks (kevin_exp/launch/threads.py)
    cpus_per_task: int = number(16, ge=1)
    # host memory of one node (all its ranks)
    mem_gb: int = number(128, ge=1)
    timeout_min: int = number(240, ge=1)
    # refuse to launch when the estimate exceeds this share of the GPU memory (allocator slack, CUDA context)
    max_memory_fraction: float = number(0.9, gt=0, le=1)
    # false: skip the launch-time memory check
    check: bool = True
    # a collective waits this long for the slowest rank before the run fails (a trainer's own
    # trainer.dist_timeout_s wins): longer than a rank's longest lone phase (generation, kernel evaluation)
    dist_timeout_s: float = number(1800.0, gt=0)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def extra_checks(self, prefix: str) -> list[str]:
        if self.gpus_per_node and self.ranks_per_node > self.gpus_per_node:
            return [f"{prefix}ranks_per_node={self.ranks_per_node}: one rank per GPU, so at most "
                    f"{prefix}gpus_per_node={self.gpus_per_node} (leave ranks_per_node out to follow gpus_per_node)"]
        return []
