"""The sharding trainer's layout, resolved from the memory estimate when it is ``auto`` (trainer=deepspeed's
defaults): the fastest that fits, what is set by hand kept, micro-batches filling what is left, and on a machine
without GPUs the layout of host memory."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.launch.layout import STATES, TOKEN_STEP, layout_line, resolve_layout, step_tokens_per_rank
from kevin_exp.launch.resources import estimate, layout_of
from tests.helpers import compose_train

REPO = Path(__file__).resolve().parents[2]
KB = "tasks=builtin"


def resolved(*overrides: str):
    cfg = compose_train([KB, *overrides])
    return resolve_layout(cfg, on_gpu=True)


def states(cfg) -> tuple:
    t = cfg.trainer
    return t.zero_stage, t.offload_optimizer, t.offload_params


def per_gpu(cfg, **trainer) -> float:
    return estimate(layout_of(dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, **trainer)))).per_gpu_gb


def budget(cfg) -> float:
    return cfg.resources.gpu_memory_gb * cfg.resources.max_memory_fraction


@pytest.mark.parametrize("resources", [["resources=h100x8"], ["resources=h200x8"],
                                       ["resources=h100x8", "resources.gpus_per_node=4"],
                                       ["resources=h200x8", "resources.gpus_per_node=4"]])
def test_kevin_7b_on_four_or_eight_gpus_keeps_the_optimizer_states_on_the_gpus(resources):
    cfg, reason = resolved("experiment=kevin_7b", *resources)
    assert cfg.trainer.offload_optimizer == "none" and cfg.trainer.offload_params == "none", reason
    assert "the fastest layout that fits" in reason
    assert per_gpu(cfg) <= budget(cfg)


def test_kevin_32b_on_eight_80_gb_gpus_offloads():
    cfg, reason = resolved("experiment=kevin_32b", "resources=h100x8")
    assert cfg.trainer.offload_optimizer == "cpu" and cfg.trainer.zero_stage == 3, reason


def test_the_layout_is_the_fastest_that_fits_and_its_micro_batches_the_largest():
    cfg, reason = resolved("experiment=kevin_14b", "resources=h100x8")
    chosen = STATES.index(states(cfg))
    assert chosen > 0, "a 14B model fits no faster layout on 80 GB GPUs"
    tokens = cfg.trainer.micro_batch_tokens
    for faster in STATES[:chosen]:
        one_sequence = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        assert per_gpu(cfg, **dict(zip(("zero_stage", "offload_optimizer", "offload_params"), faster)),
                       micro_batch_tokens=one_sequence) > budget(cfg)
    assert per_gpu(cfg) <= budget(cfg)
    assert tokens == step_tokens_per_rank(cfg) or per_gpu(cfg, micro_batch_tokens=tokens + TOKEN_STEP) > budget(cfg)
    assert f"micro-batches of {tokens} tokens" in reason


def test_a_setting_given_by_hand_is_kept_and_the_rest_chosen_around_it():
    cfg, _ = resolved("experiment=kevin_7b", "resources=h200x8", "trainer.zero_stage=3")
    assert states(cfg) == (3, "none", "none")
    cfg, _ = resolved("experiment=kevin_7b", "resources=h200x8", "trainer.offload_optimizer=cpu",
                      "trainer.micro_batch_tokens=8192")
    assert cfg.trainer.offload_optimizer == "cpu" and cfg.trainer.micro_batch_tokens == 8192
    # nothing left to choose: nothing is said
    every = ["trainer.zero_stage=3", "trainer.offload_optimizer=cpu", "trainer.offload_params=none",
             "trainer.micro_batch_tokens=4096"]
    cfg, reason = resolved("experiment=kevin_7b", *every)
    assert reason is None and states(cfg) == (3, "cpu", "none")


def test_without_a_gpu_the_states_stay_sharded_in_host_memory():
    cfg, reason = resolve_layout(compose_train(["trainer=deepspeed"]), on_gpu=False)
    assert states(cfg) == (3, "none", "none") and cfg.trainer.micro_batch_tokens == 16384
    assert layout_line(cfg, reason) == ("layout: zero_stage=3 offload_optimizer=none offload_params=none "
                                        "micro_batch_tokens=16384 (no GPU: the states stay in host memory, sharded "
                                        "over the ranks)")


def test_the_torch_trainer_has_no_layout_to_resolve():
    cfg = compose_train([KB])
    assert resolve_layout(cfg, on_gpu=True) == (cfg, None)


def test_the_memory_report_prints_the_layout_line():
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.launch.memory_report", "experiment=kevin_7b",
                           "resources=h200x8", "resources.gpus_per_node=4"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[0]
    assert re.fullmatch(r"layout: zero_stage=[23] offload_optimizer=none offload_params=none "
                        r"micro_batch_tokens=\d+ \(the fastest layout that fits: .*\)", line), line
    assert "fits" in proc.stdout and "DOES NOT FIT" not in proc.stdout


def _generation(cfg, batch: int):
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, generation_batch_size=batch))


def test_the_generation_batch_is_what_the_kv_cache_left_by_the_layout_holds():
    """kevin_32b on 8 x 141 GB: the trainer's layout first, then the most sequences per generate() call whose KV
    cache still fits beside it; one more would not."""
    from kevin_exp.launch.layout import generation_line, sequences_per_turn

    cfg, _ = resolved("experiment=kevin_32b", "resources=h200x8")
    batch = cfg.rollout.generation_batch_size
    assert 1 < batch < sequences_per_turn(cfg)
    assert estimate(layout_of(cfg)).per_gpu_gb <= budget(cfg)
    assert estimate(layout_of(_generation(cfg, batch + 1))).per_gpu_gb > budget(cfg)
    assert f"generation_batch_size={batch} (of {sequences_per_turn(cfg)} sequences" in generation_line(cfg, on_gpu=True)


def test_a_generation_batch_that_fits_whole_takes_every_sequence_of_a_turn_and_one_set_by_hand_is_kept():
    from kevin_exp.launch.layout import sequences_per_turn

    cfg, _ = resolved("experiment=kevin_7b", "resources=h200x8")
    assert cfg.rollout.generation_batch_size == sequences_per_turn(cfg) == 16  # 8 tasks over 8 ranks x 16 trajectories
    kept, _ = resolved("experiment=kevin_32b", "resources=h200x8", "rollout.generation_batch_size=2")
    assert kept.rollout.generation_batch_size == 2


def test_without_a_gpu_the_generation_batch_is_the_cpu_default():
    cfg = resolve_layout(compose_train([KB, "experiment=kevin_7b"]), on_gpu=False)[0]
    assert cfg.rollout.generation_batch_size == 16
    small = resolve_layout(compose_train([KB, "experiment=kevin_7b", "tasks_per_step=1", "n_trajectories=4",
                                          "resources.gpus_per_node=1"]), on_gpu=False)[0]
    assert small.rollout.generation_batch_size == 4
