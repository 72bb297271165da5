"""``python -m kevin_exp.launch.memory_report <train overrides>``: the memory estimate of one configuration, term by
term (``launch/resources.py`` holds the formulas), with the changes that would make it fit.

    python -m kevin_exp.launch.memory_report experiment=kevin_32b resources=h200x8 trainer.backend=deepspeed
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any

import yaml

from kevin_exp.config import TrainConfig, TrainerConfig, register_configs, to_typed, world_size_problems
from kevin_exp.config.resolvers import register_resolvers
from kevin_exp.config.trainer import LAYOUT_FIELDS
from kevin_exp.errors import user_errors
from kevin_exp.launch.layout import generation_line, layout_line, resolve_layout
from kevin_exp.launch.memory_check import fixes_for
from kevin_exp.launch.preflight import Composer
from kevin_exp.launch.resources import MemoryLayout, estimate, layout_of, report_lines
from kevin_exp.settings_checks import AUTO

# the sharding trainer's settings: read from the config where it has them, else given to the layout directly
LAYOUT_KEYS = {"trainer.backend": "backend", "trainer.zero_stage": "zero_stage",
               "trainer.offload_optimizer": "offload_optimizer", "trainer.offload_params": "offload_params",
               "trainer.bf16": "bf16", "trainer.activation_checkpointing": "activation_checkpointing",
               "trainer.checkpoint_layers": "checkpoint_layers",
               "trainer.micro_batch_tokens": "micro_batch_tokens", "trainer.logprob_chunk_tokens": "logprob_tokens"}


def _parse(value: str) -> Any:
    return yaml.safe_load(value)


def layout_for(overrides: list[str]) -> tuple[MemoryLayout, TrainConfig]:
    """The layout ``python -m kevin_exp.train <overrides>`` would run with. Trainer settings the installed
    trainer schema does not know yet (the sharding trainer's) apply to the layout directly."""
    known = {f.name for f in dataclasses.fields(TrainerConfig)}
    backend_field = {f.name: f for f in dataclasses.fields(TrainerConfig)}["backend"]
    implemented = backend_field.metadata.get("options", ())
    direct: dict[str, Any] = {}
    composed = []
    for o in overrides:
        key, _, value = o.partition("=")
        name = key.split(".", 1)[-1]
        if key in LAYOUT_KEYS and (name not in known or (name == "backend" and value not in implemented)):
            direct[LAYOUT_KEYS[key]] = _parse(value)
        else:
            composed.append(o)
    if not any(o.split("=", 1)[0] in ("tasks", "tasks.suite") for o in composed):
        composed.append("tasks=builtin")  # memory does not depend on the tasks: no KernelBench checkout needed
    cfg = Composer("train").compose([*composed, "run_dir=unused"])
    typed = to_typed(cfg)
    if not any(key in direct for key in LAYOUT_FIELDS):
        generation_auto = typed.rollout.generation_batch_size == AUTO
        typed, reason = resolve_layout(typed, on_gpu=True)
        if reason:
            print(layout_line(typed, reason))
        if generation_auto:
            print(generation_line(typed, on_gpu=True))
    x = layout_of(typed)
    if "logprob_tokens" in direct:
        direct["logprob_tokens"] = min(int(direct["logprob_tokens"]), x.logprob_tokens)
    if "micro_batch_tokens" in direct and "logprob_tokens" not in direct:
        direct["logprob_tokens"] = min(x.logprob_tokens, int(direct["micro_batch_tokens"]))
    return dataclasses.replace(x, **direct), typed


def main(argv: list[str] | None = None) -> None:
    """``python -m kevin_exp.launch.memory_report <train overrides>``: the estimate of one configuration, term by term."""
    register_configs()
    register_resolvers()
    with user_errors():
        x, cfg = layout_for(list(sys.argv[1:] if argv is None else argv))
        est = estimate(x)
        r = cfg.resources
        print("\n".join(report_lines(x, est, r.gpu_memory_gb, r.max_memory_fraction, r.mem_gb)))
        budget = r.gpu_memory_gb * r.max_memory_fraction
        if est.per_gpu_gb > budget:
            print("fits with: " + ("; or ".join(fixes_for(x, budget)) or "none of the changes tried"))
        for problem in world_size_problems(cfg, x.world_size):
            print(f"also needed on {x.world_size} ranks: {problem}")


if __name__ == "__main__":
    main()
