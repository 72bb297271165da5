"""The sharding trainer's layout when it is ``auto``: ``trainer.zero_stage``, ``offload_optimizer``,
``offload_params`` and ``micro_batch_tokens`` (trainer=deepspeed's defaults) resolved before anything starts, from
the memory estimate of ``launch/resources.py``.

On GPUs the layout is the fastest whose estimate fits the usable memory of one GPU, in the order of ``STATES``:
parameters whole on every GPU (ZeRO-2: no gathers), then sharded (ZeRO-3), then the optimizer states on the host
(their step runs on the CPU), then the parameters too. Micro-batches then take the most tokens that still fit, up
to a rank's share of one gradient step. A value set by hand is kept, and the other settings are chosen around it
(``check_resources`` refuses a configuration that cannot fit). The resolved values replace ``auto`` in the run's
config, so config.json records what ran.

    python -m kevin_exp.launch.memory_report experiment=kevin_7b resources=h100x8   # prints the layout line
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from kevin_exp.config import TrainConfig
from kevin_exp.config.trainer import LAYOUT_FIELDS
from kevin_exp.launch.resources import SHARDING_TRAINERS, estimate, layout_of
from kevin_exp.settings_checks import AUTO

# (zero_stage, offload_optimizer, offload_params), fastest first
STATES = ((2, "none", "none"), (3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu"))
# without a GPU the states live in host memory whatever the offload: ZeRO-3 keeps each rank's share smallest
CPU_STATES = (3, "none", "none")
CPU_MICRO_BATCH_TOKENS = 16384
# rollout.generation_batch_size=auto without a GPU
CPU_GENERATION_BATCH = 16
# micro-batch budgets are searched in steps of this many tokens
TOKEN_STEP = 1024


def layout_line(cfg: TrainConfig, reason: str) -> str:
    t = cfg.trainer
    return (f"layout: zero_stage={t.zero_stage} offload_optimizer={t.offload_optimizer} "
            f"offload_params={t.offload_params} micro_batch_tokens={t.micro_batch_tokens} ({reason})")


def _with(cfg: TrainConfig, **values: Any) -> TrainConfig:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **values))


def _per_gpu_gb(cfg: TrainConfig) -> float:
    return estimate(layout_of(cfg)).per_gpu_gb


def _sequence_tokens(cfg: TrainConfig) -> int:
    return cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens


def step_tokens_per_rank(cfg: TrainConfig) -> int:
    """The most tokens one rank trains on in one gradient step: its share of a minibatch, every sequence at
    the longest (a micro-batch larger than this holds nothing more)."""
    samples = cfg.tasks_per_step * cfg.n_trajectories * cfg.n_turns
    per_rank = math.ceil(samples / cfg.trainer.minibatches / max(1, cfg.resources.world_size))
    return max(1, per_rank) * _sequence_tokens(cfg)


def _largest_fitting_tokens(cfg: TrainConfig, budget_gb: float) -> int:
    """The largest micro-batch budget (a multiple of TOKEN_STEP, at least one sequence) that fits, up to a rank's
    tokens of one gradient step."""
    low = _sequence_tokens(cfg)
    high = max(low, step_tokens_per_rank(cfg))
    if _per_gpu_gb(_with(cfg, micro_batch_tokens=high)) <= budget_gb:
        return high
    best = low
    lo, hi = 1, high // TOKEN_STEP
    while lo <= hi:
        mid = (lo + hi) // 2
        tokens = max(low, mid * TOKEN_STEP)
        if _per_gpu_gb(_with(cfg, micro_batch_tokens=tokens)) <= budget_gb:
            best, lo = tokens, mid + 1
        else:
            hi = mid - 1
    return best


def _gpu_layout(cfg: TrainConfig) -> tuple[dict[str, Any], str]:
    t, r = cfg.trainer, cfg.resources
    budget = r.gpu_memory_gb * r.max_memory_fraction
    fixed = {name: getattr(t, name) for name in LAYOUT_FIELDS if getattr(t, name) != AUTO}
    candidates = [dict(zip(LAYOUT_FIELDS[:3], states)) for states in STATES]
    candidates = [c for c in candidates if all(fixed.get(k, v) == v for k, v in c.items())] or \
        [{k: fixed.get(k, v) for k, v in dict(zip(LAYOUT_FIELDS[:3], STATES[-1])).items()}]
    tokens = fixed.get("micro_batch_tokens", _sequence_tokens(cfg))
    for states in candidates:
        trial = _with(cfg, **states, micro_batch_tokens=tokens)
        gb = _per_gpu_gb(trial)
        if gb <= budget:
            reason = (f"the fastest layout that fits: about {gb:.0f} GB per GPU with one sequence per micro-batch, "
                      f"of {budget:.0f} GB usable")
            break
    else:
        states = candidates[-1]
        trial = _with(cfg, **states, micro_batch_tokens=tokens)
        reason = (f"no layout fits {budget:.0f} GB per GPU: the one that saves most, about "
                  f"{_per_gpu_gb(trial):.0f} GB per GPU")
        return {**states, "micro_batch_tokens": tokens}, reason
    if "micro_batch_tokens" not in fixed:
        tokens = _largest_fitting_tokens(trial, budget)
        reason += (f"; micro-batches of {tokens} tokens, about {_per_gpu_gb(_with(trial, micro_batch_tokens=tokens)):.0f} "
                   f"GB per GPU" + (" (a rank's whole share of a gradient step)"
                                    if tokens == step_tokens_per_rank(cfg) else ""))
    return {**states, "micro_batch_tokens": tokens}, reason


def resolve_layout(cfg: TrainConfig, on_gpu: bool) -> tuple[TrainConfig, str | None]:
    """``cfg`` with every ``auto`` layout setting resolved (the trainer's, then ``rollout.generation_batch_size``
    around it), and the trainer layout's reason (None when nothing of it was ``auto``, or the trainer does not
    shard). ``on_gpu``: whether the run trains on GPUs (else the layout of host memory)."""
    generation_auto = cfg.rollout.generation_batch_size == AUTO
    if generation_auto:  # the trainer's layout is chosen with the smallest generation batch, which then fills up
        cfg = _with_generation(cfg, 1)
    cfg, reason = _resolve_trainer(cfg, on_gpu)
    if generation_auto:
        cfg = _with_generation(cfg, generation_batch(cfg, on_gpu))
    return cfg, reason


def _with_generation(cfg: TrainConfig, batch: int) -> TrainConfig:
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, generation_batch_size=batch))


def sequences_per_turn(cfg: TrainConfig) -> int:
    """The sequences one rank generates in one turn (its tasks' trajectories): a larger batch holds nothing more."""
    return max(1, math.ceil(cfg.tasks_per_step / max(1, cfg.resources.world_size))) * cfg.n_trajectories


def generation_batch(cfg: TrainConfig, on_gpu: bool) -> int:
    """The most sequences per generate() call whose KV cache fits the usable memory of one GPU beside the rest of
    the run's estimate (phases that run at once add up), up to a rank's sequences of a turn; at least 1 (the
    resource check then says what does not fit). Without a GPU: ``CPU_GENERATION_BATCH``."""
    most = sequences_per_turn(cfg)
    if not on_gpu:
        return min(CPU_GENERATION_BATCH, most)
    budget = cfg.resources.gpu_memory_gb * cfg.resources.max_memory_fraction
    fits = lambda n: _per_gpu_gb(_with_generation(cfg, n)) <= budget  # noqa: E731
    if fits(most):
        return most
    lo, hi, best = 2, most - 1, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def generation_line(cfg: TrainConfig, on_gpu: bool) -> str:
    """The resolved ``rollout.generation_batch_size=auto``, and why."""
    batch, most = cfg.rollout.generation_batch_size, sequences_per_turn(cfg)
    if not on_gpu:
        return f"generation: generation_batch_size={batch} (no GPU: {CPU_GENERATION_BATCH} at most, of {most} a turn)"
    return (f"generation: generation_batch_size={batch} (of {most} sequences a rank generates in a turn; their KV "
            f"cache at {_sequence_tokens(cfg)} tokens, about {estimate(layout_of(cfg)).kv_cache_gb:.1f} GB per GPU)")


def _resolve_trainer(cfg: TrainConfig, on_gpu: bool) -> tuple[TrainConfig, str | None]:
    if cfg.trainer.backend not in SHARDING_TRAINERS or not cfg.trainer.unresolved_layout():
        return cfg, None
    if on_gpu:
        values, reason = _gpu_layout(cfg)
    else:
        values = {**dict(zip(LAYOUT_FIELDS[:3], CPU_STATES)), "micro_batch_tokens": CPU_MICRO_BATCH_TOKENS}
        reason = "no GPU: the states stay in host memory, sharded over the ranks"
    chosen = {name: values[name] for name in cfg.trainer.unresolved_layout()}
    return _with(cfg, **chosen), reason
