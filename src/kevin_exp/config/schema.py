"""The whole run's schema (``TrainConfig``): every group, the headline knobs and the checks across groups.

Headline knobs sit at the top level so sweeps read like the paper (``-m gamma=0.0,0.4,1.0``):
``model`` (a group), ``gamma``, ``n_turns``, ``n_trajectories``, ``tasks_per_step``, ``steps``,
``normalization``, ``seed``. ``gamma`` and ``normalization`` live only here: the credit, the loss and the records
all read them from ``TrainConfig``.
The defaults of these dataclasses are the embedded default run's (``conf/train.yaml`` with its default
groups); a test holds the two together.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kevin_exp.config.algorithm import AlgorithmConfig
from kevin_exp.config.evaluator import EvaluatorConfig
from kevin_exp.config.launch_settings import LoggerConfig, ResourcesConfig
from kevin_exp.config.model import ModelConfig
from kevin_exp.config.rollout import RolloutConfig
from kevin_exp.config.tasks import TasksConfig
from kevin_exp.config.trainer import TrainerConfig
from kevin_exp.settings_checks import choice, number


def _normalizations() -> tuple[str, ...]:
    from kevin_exp.rl.loss import NORMALIZATIONS

    return NORMALIZATIONS


def kernel_menu_problems(cfg: "TrainConfig") -> list[str]:
    """What tasks=kernel_menu cannot run with: its kernels are C++ for the cpu backend, and its answers are letters."""
    if cfg.tasks.suite != "kernel_menu":
        return []
    problems = []
    if cfg.evaluator.backend != "cpu":
        problems.append(f"evaluator.backend={cfg.evaluator.backend}: tasks=kernel_menu has C++ kernels for the cpu backend "
                        "only; set evaluator.backend=cpu (experiment=learn_cpu does)")
    if cfg.rollout.backend == "scripted":
        problems.append("rollout.backend=scripted answers with whole programs, but tasks=kernel_menu reads a letter of its "
                        "menu; use rollout.backend=hf")
    return problems


def world_size_problems(cfg: "TrainConfig", world_size: int) -> list[str]:
    """What a run of ``world_size`` ranks cannot do with these settings (each rank rolls out whole tasks)."""
    problems = []
    if world_size > 1 and cfg.trainer.backend != "deepspeed":
        problems.append(f"trainer.backend={cfg.trainer.backend}: a run of {world_size} ranks trains with "
                        "trainer=deepspeed")
    if cfg.tasks_per_step % world_size:
        problems.append(f"tasks_per_step={cfg.tasks_per_step}: each of the {world_size} ranks rolls out whole tasks, so "
                        f"it must be a multiple of the world size (e.g. tasks_per_step="
                        f"{world_size * max(1, cfg.tasks_per_step // world_size)})")
    return problems


@dataclass
class EvalConfig:
    """Held-out evaluation (python -m kevin_exp.evaluate): Kevin evaluates 16 parallel trajectories x 8 turns."""

    n_trajectories: int = number(16, ge=1)
    n_turns: int = number(8, ge=1)
    # tasks rolled out together (bounded by generation memory); every task is evaluated
    tasks_per_batch: int = number(2, ge=1)


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    # headline knobs (the paper's names; groups interpolate them)
    # the discount of later turns' scores in a turn's return (Kevin section 4.3)
    gamma: float = number(0.4, ge=0, le=1)
    n_turns: int = number(2, ge=1)
    n_trajectories: int = number(4, ge=1)
    tasks_per_step: int = number(2, ge=1)
    steps: int = number(2, ge=1)
    # the loss's normalisation of token sums: constant | token | sequence
    normalization: str = choice("constant", _normalizations)
    seed: int = number(0, ge=0)
    # auto: continue from the run dir's latest checkpoint if there is one; never: start over
    resume: str = choice("auto", ("auto", "never"))
    # where records and checkpoints go (null: the Hydra job's directory)
    run_dir: Optional[str] = None
    experiment: Optional[str] = None
    sweep_name: Optional[str] = None
    # python -m kevin_exp.evaluate: the policy to evaluate (a run dir, or one of its checkpoints/step_NNNNNN;
    # null: the model's own weights) and how
    checkpoint: Optional[str] = None
    eval: EvalConfig = field(default_factory=EvalConfig)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        kv_bytes = self.rollout.vllm.kv_cache_memory_bytes
        if self.rollout.backend == "vllm" and kv_bytes is not None and kv_bytes > self.resources.gpu_memory_gb * 1e9:
            problems.append(f"rollout.vllm.kv_cache_memory_bytes={kv_bytes}: more than the GPU's memory "
                            f"(resources.gpu_memory_gb={self.resources.gpu_memory_gb:g}); give bytes, e.g. 8000000000 for 8 GB")
        if self.rollout.async_steps and self.trainer.backend == "deepspeed":
            problems.append(f"rollout.async_steps={self.rollout.async_steps}: not implemented with trainer=deepspeed (its "
                            "weight push to the generator is a collective inside the training step); use trainer=torch or "
                            "rollout.async_steps=0")
        if self.trainer.backend == "deepspeed" and self.algorithm.kl_coef > 0:
            problems.append(f"algorithm.kl_coef={self.algorithm.kl_coef}: the KL term's reference policy is not built for "
                            "trainer=deepspeed; use algorithm.kl_coef=0 or trainer=torch")
        if (self.trainer.backend == "torch" and self.trainer.checkpoint_layers != 1.0
                and not self.model.gradient_checkpointing):
            problems.append(f"trainer.checkpoint_layers={self.trainer.checkpoint_layers}: a share of the checkpointed "
                            "layers, but model.gradient_checkpointing=false; turn it on or leave checkpoint_layers=1")
        problems += kernel_menu_problems(self)
        from kevin_exp.launch.world import context_from_env

        problems += world_size_problems(self, context_from_env().world_size)
        return problems
