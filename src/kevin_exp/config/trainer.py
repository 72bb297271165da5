"""The ``trainer`` group: the policy update's backend, device, optimiser and checkpoints."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from kevin_exp.settings_checks import AUTO, auto_or_integer, choice, number


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
    # tokens per forward/backward, padding included (backend=deepspeed; a longer sequence runs alone); auto: the
    # most that fits the GPU memory the layout leaves (kevin_exp/launch/layout.py)
    micro_batch_tokens: Any = auto_or_integer(16384, ge=1)
    # response positions whose logits are computed at once (the vocabulary's fp32 logits of this many tokens)
    logprob_chunk_tokens: int = number(4096, ge=1)
    checkpoint_every: int = number(1, ge=1)
    # the optimizer's states (and the RNG states) are kept on checkpoints whose step is a multiple of state_every,
    # and on the run's last: the checkpoints between hold the policy only (a quarter of a 7B checkpoint's bytes
    # under AdamW in bf16). A run resumes from the newest checkpoint that holds them; rows after it are dropped
    state_every: int = number(1, ge=1)
    # checkpoints kept: the newest keep_checkpoints, plus those whose step is a multiple of keep_every (0: none)
    # and any folder holding a file named `keep` (kevin_exp/trainer/checkpoint.py)
    keep_checkpoints: int = number(1, ge=1)
    keep_every: int = number(0, ge=0)
    # backend=deepspeed only (docs/deepspeed.md): ZeRO stage, offloads, bf16, activation checkpointing. ``auto``
    # (trainer=deepspeed's default for the stage, the offloads and micro_batch_tokens): the fastest layout whose
    # memory estimate fits the run's GPUs, resolved before the run starts and recorded resolved
    zero_stage: Any = auto_or_integer(3, ge=2, le=3)
    offload_optimizer: str = choice("none", (AUTO, "none", "cpu"))
    # stage 3 only
    offload_params: str = choice("none", (AUTO, "none", "cpu"))
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

    def unresolved_layout(self) -> list[str]:
        """The layout settings still ``auto`` (kevin_exp/launch/layout.py resolves them before a run starts)."""
        return [name for name in LAYOUT_FIELDS if getattr(self, name) == AUTO]

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        if self.state_every % self.checkpoint_every:
            problems.append(f"{prefix}state_every={self.state_every}: expected a multiple of {prefix}checkpoint_every="
                            f"{self.checkpoint_every} (the optimizer's states are kept on checkpoint steps)")
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
        if self.offload_params == "cpu" and self.zero_stage == 2:
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


# the sharding trainer's layout: each may be ``auto``
LAYOUT_FIELDS = ("zero_stage", "offload_optimizer", "offload_params", "micro_batch_tokens")

# TrainerConfig fields that only backend=deepspeed reads
DEEPSPEED_ONLY = ("micro_batch_tokens", "zero_stage", "offload_optimizer", "offload_params", "bf16",
                  "activation_checkpointing", "deepspeed_config")
