"""Launch-time memory check: a configuration whose model cannot fit the GPUs it asks for stops before anything
runs (or is submitted), with the numbers and the fix, instead of running out of memory on the cluster.

Per-GPU estimate for the learner and the rollout that share each GPU (Kevin App. C: every GPU generates, then
trains):
- weights: params x bytes of ``model.dtype``; gradients the same; AdamW keeps two moments in the parameters'
  dtype (torch's AdamW), so optimizer states are twice the weights; a frozen reference copy when ``kl_coef > 0``;
- these are divided across GPUs only by a sharding trainer (ZeRO-3); the single-process ``torch`` trainer keeps
  all of them on one GPU;
- rollout KV cache: generation_batch_size x (max_prompt_tokens + max_new_tokens) x layers x 2 x kv_heads x
  head_dim x bytes (skipped when the model config does not give its architecture);
- activations are not counted (gradient checkpointing keeps them small); the margin is ``max_memory_fraction``.
"""
from __future__ import annotations

from dataclasses import dataclass

from kevin_exp.config import TrainConfig
from kevin_exp.errors import UserError

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SHARDING_TRAINERS = {"deepspeed"}
GB = 1e9


class ResourceError(UserError):
    pass


@dataclass(frozen=True)
class MemoryEstimate:
    weights_gb: float
    gradients_gb: float
    optimizer_gb: float
    reference_gb: float
    kv_cache_gb: float
    shards: int

    @property
    def per_gpu_gb(self) -> float:
        sharded = (self.weights_gb + self.gradients_gb + self.optimizer_gb + self.reference_gb) / self.shards
        return sharded + self.kv_cache_gb


def estimate_memory(cfg: TrainConfig) -> MemoryEstimate:
    m = cfg.model
    if m.dtype not in BYTES:
        raise ResourceError(f"model.dtype={m.dtype!r}: expected one of {', '.join(BYTES)}")
    b = BYTES[m.dtype]
    weights = m.params_b * 1e9 * b / GB
    gpus = max(1, cfg.resources.nodes * cfg.resources.gpus_per_node)
    shards = gpus if cfg.trainer.backend in SHARDING_TRAINERS else 1
    kv = 0.0
    if m.layers and m.kv_heads and m.head_dim:
        tokens = cfg.rollout.generation_batch_size * (cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens)
        kv = tokens * m.layers * 2 * m.kv_heads * m.head_dim * b / GB
    return MemoryEstimate(weights, weights, 2 * weights, weights if cfg.algorithm.kl_coef > 0 else 0.0, kv, shards)


def check_resources(cfg: TrainConfig) -> MemoryEstimate:
    """Raises ResourceError naming the numbers and the fix when the estimate does not fit one GPU."""
    est = estimate_memory(cfg)
    r = cfg.resources
    budget = r.gpu_memory_gb * r.max_memory_fraction
    if not r.check or est.per_gpu_gb <= budget:
        return est
    gpus = r.nodes * r.gpus_per_node
    fixed = est.weights_gb + est.gradients_gb + est.optimizer_gb + est.reference_gb
    lines = [
        f"model={cfg.model.name} ({cfg.model.params_b:g}B params, {cfg.model.dtype}) does not fit the requested GPUs: "
        f"about {est.per_gpu_gb:.0f} GB per GPU against {budget:.0f} GB usable "
        f"({r.max_memory_fraction:.0%} of resources.gpu_memory_gb={r.gpu_memory_gb:g}) on {gpus} GPU(s).",
        f"  weights {est.weights_gb:.1f} GB + gradients {est.gradients_gb:.1f} GB + AdamW states {est.optimizer_gb:.1f} GB"
        + (f" + KL reference {est.reference_gb:.1f} GB" if est.reference_gb else "")
        + (f", divided over {est.shards} GPUs (trainer.backend={cfg.trainer.backend})" if est.shards > 1
           else f", all on one GPU (trainer.backend={cfg.trainer.backend} does not shard)")
        + f"; rollout KV cache {est.kv_cache_gb:.1f} GB (rollout.generation_batch_size="
          f"{cfg.rollout.generation_batch_size} x {cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens} tokens).",
    ]
    fixes = []
    if est.kv_cache_gb > budget / 2:
        fixes.append("lower rollout.generation_batch_size")
    if est.shards == 1 and fixed > budget:
        fixes.append("a sharding trainer (ZeRO-3 via trainer.backend=deepspeed) over enough GPUs, or a smaller model "
                     "(model=7b, model=smollm2_135m)")
    elif est.shards > 1:
        need = int(fixed // max(1e-9, budget - est.kv_cache_gb)) + 1
        fixes.append(f"at least {need} GPUs (resources.nodes x resources.gpus_per_node)")
    fixes.append("larger GPUs (resources.gpu_memory_gb), or resources.check=false to launch anyway")
    lines.append("  fix: " + "; or ".join(fixes))
    raise ResourceError("\n".join(lines))


def uses_gpu(cfg: TrainConfig) -> bool:
    """The check applies to runs that train on a GPU, and to hub models, which only ever run on GPUs."""
    if cfg.model.source == "hf":
        return True
    if cfg.trainer.device == "auto":
        import torch

        return torch.cuda.is_available()
    return cfg.trainer.device.startswith("cuda")
