"""The DeepSpeed config of a run, generated from ``trainer.*`` (a pure function: no DeepSpeed import).

- Batch sizes: the learner sets each gradient step's accumulation boundary itself (the step's micro-batches
  are token-budgeted and equalised over ranks, and the loss is already normalised over the whole step), so
  DeepSpeed is told one micro-batch per step and never scales the loss by an accumulation count.
- Optimizer: AdamW with the trainer's lr, betas and weight decay; torch's own AdamW (``torch_adam``) unless
  the optimizer states are offloaded to the CPU, where DeepSpeed's CPU Adam is the one it accepts.
- The lr schedule (linear warm-up, then constant) is the torch learner's ``LambdaLR``, handed to
  ``deepspeed.initialize`` as a client scheduler, so both backends follow one schedule; it is not in this config.
- ``load_universal``: set when resuming from a checkpoint written by another number of ranks.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

from kevin_exp.config import TrainerConfig

ADAM_EPS = 1e-8


def generate_deepspeed_config(trainer: TrainerConfig, world_size: int, load_universal: bool = False) -> dict[str, Any]:
    auto = trainer.unresolved_layout()
    if auto:
        raise ValueError(f"trainer.{auto[0]}=auto: a run resolves its layout before the learner starts "
                         "(kevin_exp.launch.layout.resolve_layout)")
    zero: dict[str, Any] = {
        "stage": trainer.zero_stage,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "reduce_bucket_size": 5e8,
    }
    if trainer.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if trainer.zero_stage == 3:
        zero.update({"stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e6,
                     "stage3_gather_16bit_weights_on_model_save": False})
        if trainer.offload_params == "cpu":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": trainer.grad_clip,
        "optimizer": {"type": "AdamW", "params": {
            "lr": trainer.lr, "betas": [trainer.adam_beta1, trainer.adam_beta2], "eps": ADAM_EPS,
            "weight_decay": trainer.weight_decay, "torch_adam": trainer.offload_optimizer == "none",
            "adam_w_mode": True}},
        "bf16": {"enabled": trainer.bf16},
        "zero_optimization": zero,
        "checkpoint": {"load_universal": load_universal},
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``, object by object (a value that is not an object replaces)."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def run_deepspeed_config(trainer: TrainerConfig, world_size: int, load_universal: bool = False) -> dict[str, Any]:
    """The generated config with the user's ``trainer.deepspeed_config`` file merged on top."""
    config = generate_deepspeed_config(trainer, world_size, load_universal)
    if trainer.deepspeed_config:
        config = merged(config, json.loads(Path(trainer.deepspeed_config).expanduser().read_text()))
    return config
