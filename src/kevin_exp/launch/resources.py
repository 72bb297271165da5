"""Launch-time resource check: memory per GPU and host memory per node of a configuration, from formulas (written
out with their sources in docs/scaling.md); a configuration that does not fit stops before anything runs (or is
submitted), with the numbers and the fixes that would make it fit.

    python -m kevin_exp.launch.memory_report experiment=kevin_32b resources=h200x8 trainer.backend=deepspeed

``estimate(layout)`` is a pure function of a ``MemoryLayout`` (what the formulas read: model size and shape,
trainer, sequence lengths, world size); ``layout_of(cfg)`` reads one from a run's config. Trainer settings of the
sharding trainer (``trainer.zero_stage``, ``offload_optimizer``, ``offload_params``, ``bf16``,
``activation_checkpointing``, ``micro_batch_tokens``, ``logprob_chunk_tokens``) are read where the config has them,
with the defaults below otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kevin_exp.config import TrainConfig
from kevin_exp.errors import UserError

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SHARDING_TRAINERS = {"deepspeed"}
GB = 1e9
# CUDA context, cuBLAS/cuDNN workspaces and the caching allocator's first blocks, per GPU
CUDA_CONTEXT_GB = 1.0
# NCCL's buffers and streams per GPU, when there is more than one rank
NCCL_GB = 1.0
# DeepSpeed ZeRO-2's reduce and all-gather buckets: 5e8 elements each (its defaults), bf16
ZERO2_BUCKETS_GB = 2 * 5e8 * 2 / GB
# one rank's host process outside its tensors: Python, torch and CUDA host state, tokenizer, pinned staging
RANK_PROCESS_GB = 6.0
# DeepSpeed's pinned staging beside the offloaded optimizer states, bytes per parameter (per rank: divided by W)
HOST_OFFLOAD_BUFFERS_BYTES = 4
# one HF checkpoint shard file, what a ZeRO-3 rank holds in host memory at a time while loading
CHECKPOINT_SHARD_GB = 5.0
# one compiler process of the evaluator (nvcc/cicc on a KernelBench kernel with torch headers)
COMPILE_WORKER_GB = 1.0


class ResourceError(UserError):
    pass


@dataclass(frozen=True)
class MemoryLayout:
    """What the memory formulas read from a configuration."""

    model: str
    params_b: float
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    kv_dim: int  # kv_heads x head_dim
    dtype: str
    backend: str = "torch"
    zero_stage: int = 3
    offload_optimizer: str = "none"
    offload_params: str = "none"
    bf16: bool = True
    activation_checkpointing: bool = True
    # share of the decoder layers checkpointed (trainer.checkpoint_layers)
    checkpoint_layers: float = 1.0
    # tokens of one micro-batch (prompt + response) and the response tokens whose log-probs are kept
    micro_batch_tokens: int = 0
    logprob_tokens: int = 0
    # rollout: sequences generated together and their length
    generation_batch: int = 0
    sequence_tokens: int = 0
    reference: bool = False
    world_size: int = 1
    ranks_per_node: int = 1
    cpus_per_rank: int = 1
    eval_slot_gb: float = 0.0
    # rollout.backend=vllm: the engine's whole share of each GPU while it is awake (weights, activations, KV
    # cache); it sleeps (level 2, nothing left on the GPU) while the learner trains
    vllm_gb: float = 0.0
    # rollout.async_steps=1: the next step generates (from its own copy of the model) while this one trains
    async_steps: bool = False

    @property
    def sharded(self) -> bool:
        return self.backend in SHARDING_TRAINERS


@dataclass(frozen=True)
class MemoryEstimate:
    """GB per GPU (states resident through the step, then the larger of the training and the generation phase's
    working set) and GB of host memory per node."""

    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    reference_gb: float
    # the in-process generator's whole model, beside ZeRO-3's partitioned training copy
    generator_gb: float
    activations_gb: float
    logprobs_gb: float
    buffers_gb: float
    kv_cache_gb: float
    vllm_gb: float
    runtime_gb: float
    shards: int
    host_offload_gb: float
    host_processes_gb: float
    host_load_gb: float
    host_evaluator_gb: float
    # rollout.async_steps=1: generation and training run at once, so their working sets add up
    phases_overlap: bool = False

    @property
    def states_gb(self) -> float:
        return self.weights_gb + self.gradients_gb + self.optimizer_gb + self.reference_gb + self.generator_gb

    @property
    def train_phase_gb(self) -> float:
        return self.activations_gb + self.logprobs_gb

    @property
    def generate_phase_gb(self) -> float:
        return self.kv_cache_gb + self.vllm_gb

    @property
    def per_gpu_gb(self) -> float:
        phases = (self.train_phase_gb + self.generate_phase_gb if self.phases_overlap
                  else max(self.train_phase_gb, self.generate_phase_gb))
        return self.runtime_gb + self.states_gb + self.buffers_gb + phases

    @property
    def host_per_node_gb(self) -> float:
        return max(self.host_load_gb, self.host_offload_gb) + self.host_processes_gb + self.host_evaluator_gb


def _trainer(cfg: TrainConfig, name: str, default: Any) -> Any:
    value = getattr(cfg.trainer, name, None)
    return default if value is None else value


def layout_of(cfg: TrainConfig) -> MemoryLayout:
    """The layout of a run's config (trainer settings of the sharding trainer read where they exist; an ``auto``
    one must be resolved first: kevin_exp.launch.layout.resolve_layout)."""
    m, r, ro = cfg.model, cfg.resources, cfg.rollout
    auto = cfg.trainer.unresolved_layout()
    if auto and cfg.trainer.backend in SHARDING_TRAINERS:
        raise ResourceError(f"trainer.{auto[0]}=auto has no estimate until it is resolved (launch/layout.py)")
    if not isinstance(ro.generation_batch_size, int):
        raise ResourceError("rollout.generation_batch_size=auto has no estimate until it is resolved (launch/layout.py)")
    if m.dtype not in BYTES:
        raise ResourceError(f"model.dtype={m.dtype!r}: expected one of {', '.join(BYTES)}")
    sequence = ro.max_prompt_tokens + ro.max_new_tokens
    sharded = cfg.trainer.backend in SHARDING_TRAINERS
    if sharded:
        # a micro-batch of trainer.micro_batch_tokens (a longer sequence runs alone)
        micro_tokens = max(int(_trainer(cfg, "micro_batch_tokens", sequence)), sequence)
        response_tokens = micro_tokens
    else:
        micro_tokens = cfg.trainer.micro_batch_size * sequence
        response_tokens = cfg.trainer.micro_batch_size * ro.max_new_tokens
    chunk = int(_trainer(cfg, "logprob_chunk_tokens", 0))
    return MemoryLayout(
        model=m.name, params_b=m.params_b, layers=m.layers, hidden=m.hidden_size, intermediate=m.intermediate_size,
        vocab=m.vocab_size, kv_dim=m.kv_heads * m.head_dim, dtype=m.dtype, backend=cfg.trainer.backend,
        zero_stage=int(_trainer(cfg, "zero_stage", 3)), offload_optimizer=str(_trainer(cfg, "offload_optimizer", "none")),
        offload_params=str(_trainer(cfg, "offload_params", "none")),
        bf16=bool(_trainer(cfg, "bf16", False)) if sharded else m.dtype == "bfloat16",
        activation_checkpointing=bool(_trainer(cfg, "activation_checkpointing", False)) if sharded
        else m.gradient_checkpointing,
        checkpoint_layers=float(_trainer(cfg, "checkpoint_layers", 1.0)),
        micro_batch_tokens=micro_tokens, logprob_tokens=min(chunk, response_tokens) if chunk else response_tokens,
        generation_batch=ro.generation_batch_size, sequence_tokens=sequence, reference=cfg.algorithm.kl_coef > 0,
        world_size=max(1, r.nodes * r.ranks_per_node), ranks_per_node=r.ranks_per_node, cpus_per_rank=r.cpus_per_task,
        eval_slot_gb=cfg.evaluator.memory_limit_gb if cfg.evaluator.resolved_backend() == "cuda" else 0.0,
        vllm_gb=_vllm_gb(cfg), async_steps=bool(ro.async_steps),
    )


# an engine's own activations, CUDA graphs and sampler buffers beside its weights and KV cache (vLLM profiles
# them at start; a few GB for 7B-32B models)
VLLM_RUNTIME_GB = 2.0


def _vllm_gb(cfg: TrainConfig) -> float:
    """The engine's memory: its fraction of the GPU's total, or its weights (split over its tensor-parallel
    GPUs) + the KV cache given in bytes + its runtime."""
    v = cfg.rollout.vllm
    if cfg.rollout.backend != "vllm":
        return 0.0
    if v.kv_cache_memory_bytes is None:
        return float(v.gpu_memory_utilization) * cfg.resources.gpu_memory_gb
    weights = BYTES.get(cfg.model.dtype, 2) * cfg.model.params_b * 1e9 / v.tensor_parallel_size
    return (weights + v.kv_cache_memory_bytes) / GB + VLLM_RUNTIME_GB


def estimate(x: MemoryLayout) -> MemoryEstimate:
    """Memory per GPU and host memory per node (docs/scaling.md gives each formula)."""
    p = x.params_b * 1e9
    w = x.world_size
    if x.sharded:
        # mixed precision: bf16 parameters and gradients, fp32 master weights and Adam's two moments
        a = 2 if x.bf16 else 4
        params, grads, optim = a * p, a * p, 12 * p
        params_shards = w if x.zero_stage == 3 else 1
        gpu_params = 0.0 if x.offload_params == "cpu" else params / params_shards
        gpu_optim = 0.0 if x.offload_optimizer == "cpu" else optim / w
        gpu_grads = grads / w
        # offloaded: fp32 states and gradient partitions, and DeepSpeed's host-side buffers beside them (4 bytes per
        # parameter per rank: measured 3.4 on 2 x H200 with the Qwen2.5-3B shape, docs/benchmarks.md)
        host_offload = ((optim + 4 * p + HOST_OFFLOAD_BUFFERS_BYTES * p) / w if x.offload_optimizer == "cpu" else 0.0) \
            + (params / w if x.offload_params == "cpu" else 0.0)
        reference = (a * p / params_shards) if x.reference else 0.0
        # ZeRO-3 trains a partitioned copy; the in-process generator samples from a whole one in model.dtype (under
        # ZeRO-2 the engine trains the generator's own model: its weights are the ones counted above); a vLLM engine
        # holds its own weights (in vllm_gb) and no whole copy stays beside the learner
        generator = BYTES[x.dtype] * p if x.zero_stage == 3 and not x.vllm_gb else 0.0
        shards = w
        if x.zero_stage == 3:
            # the layer being computed and the one prefetched, gathered in full (the embedding the largest)
            layer = max((p - 2 * x.vocab * x.hidden) / max(1, x.layers), x.vocab * x.hidden)
            buffers = 2 * layer * a
        else:
            buffers = ZERO2_BUCKETS_GB * GB
        # the whole model is read on each rank: onto the GPU beside ZeRO-3's copy, or (beside a vLLM engine) into
        # host memory, once, to fill the partitioned copy
        load = (BYTES[x.dtype] * p if x.vllm_gb else CHECKPOINT_SHARD_GB * GB) if x.zero_stage == 3 else a * p
    else:
        # the single-process learner: everything in model.dtype, AdamW's two moments in that dtype too
        a = BYTES[x.dtype]
        gpu_params, gpu_grads, gpu_optim = a * p, a * p, 2 * a * p
        reference = a * p if x.reference else 0.0
        # with async steps the generator samples from a copy of its own while the learner updates the weights
        host_offload, buffers, shards, load, generator = 0.0, 0.0, 1, a * p, a * p if x.async_steps else 0.0
    act = _activation_bytes(x, a)
    # log-probs of the kept tokens: bf16 logits, their fp32 copy, the tempered logits, the log-softmax and the
    # gradient of the logits (16 bytes per vocabulary entry)
    logprobs = x.logprob_tokens * x.vocab * (16 if a == 2 else 20)
    # the transformers rollout's KV cache (a vLLM engine's is inside vllm_gb)
    kv = x.generation_batch * x.sequence_tokens * x.layers * 2 * x.kv_dim * a if x.kv_dim and x.layers and not x.vllm_gb else 0.0
    runtime = CUDA_CONTEXT_GB + (NCCL_GB if w > 1 else 0.0)
    ranks = x.ranks_per_node
    return MemoryEstimate(
        weights_gb=gpu_params / GB, gradients_gb=gpu_grads / GB, optimizer_gb=gpu_optim / GB, reference_gb=reference / GB,
        generator_gb=generator / GB,
        activations_gb=act / GB, logprobs_gb=logprobs / GB, buffers_gb=buffers / GB, kv_cache_gb=kv / GB,
        vllm_gb=x.vllm_gb, runtime_gb=runtime, shards=shards,
        host_offload_gb=ranks * host_offload / GB, host_processes_gb=ranks * RANK_PROCESS_GB,
        host_load_gb=ranks * load / GB,
        host_evaluator_gb=ranks * (x.cpus_per_rank * COMPILE_WORKER_GB + x.eval_slot_gb),
        phases_overlap=x.async_steps,
    )


def estimate_memory(cfg: TrainConfig) -> MemoryEstimate:
    return estimate(layout_of(cfg))


def _activation_bytes(x: MemoryLayout, a: int) -> float:
    """Saved activations of one micro-batch. A decoder layer keeps, per token, its two norms' inputs and outputs
    (4h), q and the attention output (2h), k and v (2 kv_dim), and the MLP's gate, up, activation and product
    (4 x intermediate). A checkpointed layer keeps only its input (h), and one layer's full set exists while it
    is recomputed; the layers left out of ``checkpoint_layers`` keep their full set."""
    if not (x.hidden and x.layers):
        return 0.0
    layer = 6 * x.hidden + 2 * x.kv_dim + 4 * x.intermediate
    checkpointed = round(x.checkpoint_layers * x.layers) if x.activation_checkpointing else 0
    per_token = checkpointed * x.hidden + (layer if checkpointed else 0) + (x.layers - checkpointed) * layer
    return x.micro_batch_tokens * per_token * a


def breakdown(x: MemoryLayout, est: MemoryEstimate) -> str:
    where = (f"ZeRO-{x.zero_stage} over {est.shards} GPUs (trainer.backend={x.backend})" if x.sharded
             else f"all on one GPU (trainer.backend={x.backend} does not shard)")
    parts = [f"weights {est.weights_gb:.1f} GB", f"gradients {est.gradients_gb:.1f} GB",
             f"AdamW states {est.optimizer_gb:.1f} GB"] + ([f"KL reference {est.reference_gb:.1f} GB"] if est.reference_gb else []) \
        + ([f"the generator's whole model {est.generator_gb:.1f} GB"] if est.generator_gb else [])
    return (" + ".join(parts) + f", {where}; activations {est.activations_gb:.1f} GB "
            f"({x.micro_batch_tokens} tokens, checkpointing {'on' if x.activation_checkpointing else 'off'}) + log-probs "
            f"{est.logprobs_gb:.1f} GB ({x.logprob_tokens} tokens) or "
            + (f"the vLLM engine {est.vllm_gb:.1f} GB (rollout.vllm.*)" if est.vllm_gb else
               f"rollout KV cache {est.kv_cache_gb:.1f} GB (rollout.generation_batch_size={x.generation_batch} x "
               f"{x.sequence_tokens} tokens)") + "; buffers "
            f"{est.buffers_gb:.1f} GB; CUDA/NCCL {est.runtime_gb:.1f} GB.")


def report_lines(x: MemoryLayout, est: MemoryEstimate, gpu_memory_gb: float, fraction: float, mem_gb: float) -> list[str]:
    rows = [("weights", est.weights_gb), ("gradients", est.gradients_gb), ("optimizer states", est.optimizer_gb),
            ("KL reference", est.reference_gb), ("generator's whole model", est.generator_gb),
            ("ZeRO buffers", est.buffers_gb), ("CUDA context + NCCL", est.runtime_gb),
            (f"activations ({x.micro_batch_tokens} tokens)", est.activations_gb),
            (f"log-prob buffers ({x.logprob_tokens} tokens)", est.logprobs_gb),
            (f"rollout KV cache ({x.generation_batch} x {x.sequence_tokens})", est.kv_cache_gb),
            ("vLLM engine (asleep while training)", est.vllm_gb)]
    where = f"ZeRO-{x.zero_stage}" if x.sharded else "one process"
    lines = [f"model={x.model} ({x.params_b:g}B) trainer.backend={x.backend} ({where}, offload optimizer "
             f"{x.offload_optimizer}, params {x.offload_params}) on {x.world_size} GPU(s), {x.ranks_per_node} per node",
             "per GPU:"]
    lines += [f"  {name:<44} {gb:8.1f} GB" for name, gb in rows]
    budget = gpu_memory_gb * fraction
    lines.append(f"  {'peak (states + max(train, generate))':<44} {est.per_gpu_gb:8.1f} GB   of {budget:.0f} GB usable "
                 f"({fraction:.0%} of {gpu_memory_gb:g}): {'fits' if est.per_gpu_gb <= budget else 'DOES NOT FIT'}")
    lines += ["host per node:",
              f"  {'offloaded states':<44} {est.host_offload_gb:8.1f} GB",
              f"  {'model loading (peak, before offload)':<44} {est.host_load_gb:8.1f} GB",
              f"  {'rank processes':<44} {est.host_processes_gb:8.1f} GB",
              f"  {'evaluator (compilers, run slots)':<44} {est.host_evaluator_gb:8.1f} GB",
              f"  {'peak':<44} {est.host_per_node_gb:8.1f} GB   of {mem_gb:g} GB: "
              f"{'fits' if est.host_per_node_gb <= mem_gb else 'DOES NOT FIT'}"]
    return lines


def uses_gpu(cfg: TrainConfig) -> bool:
    """The check applies to runs that train on a GPU, and to hub models, which only ever run on GPUs."""
    if cfg.model.source == "hf":
        return True
    if cfg.trainer.device == "auto":
        import torch

        return torch.cuda.is_available()
    return cfg.trainer.device.startswith("cuda")
