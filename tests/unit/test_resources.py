"""The launch-time memory check, on the paper's configs."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.resources import ResourceError, check_resources, estimate_memory
from tests.helpers import compose_train

REPO = Path(__file__).resolve().parents[2]
KB = "tasks.kernelbench_path=/data/KernelBench"  # composition checks the setting; the folder is not read here


def test_estimate_counts_weights_gradients_adam_states_and_kv_cache():
    est = estimate_memory(compose_train(["experiment=kevin_32b", KB]))
    assert est.weights_gb == pytest.approx(32.8 * 2)  # bf16
    assert est.gradients_gb == est.weights_gb and est.optimizer_gb == 2 * est.weights_gb
    assert est.reference_gb == 0.0  # no KL term, no frozen copy
    # 8 sequences x 32768 tokens x 64 layers x (K and V) x 8 heads x 128 dims x 2 bytes
    assert est.kv_cache_gb == pytest.approx(8 * 32768 * 64 * 2 * 8 * 128 * 2 / 1e9)
    with_kl = estimate_memory(compose_train(["experiment=kevin_32b", KB, "algorithm.kl_coef=0.001"]))
    assert with_kl.reference_gb == est.weights_gb


def test_32b_on_too_few_gpus_stops_with_the_numbers_and_the_fix():
    with pytest.raises(ResourceError) as err:
        check_resources(compose_train(["experiment=kevin_32b", KB, "resources.gpus_per_node=2"]))
    text = str(err.value)
    assert "model=32b" in text and "GB per GPU against 72 GB usable" in text
    assert "AdamW states 131.2 GB" in text and "fix:" in text and "resources.gpu_memory_gb" in text


def _sharded(cfg):
    # the formula for a sharding trainer, ahead of the DeepSpeed backend the settings still refuse
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, backend="deepspeed"))


def test_a_sharding_trainer_on_enough_gpus_fits_and_on_too_few_names_the_count():
    fits = _sharded(compose_train(["experiment=kevin_32b", KB, "resources=h200x8"]))
    assert check_resources(fits).per_gpu_gb < 141 * 0.9
    with pytest.raises(ResourceError, match=r"at least \d+ GPUs"):
        check_resources(_sharded(compose_train(["experiment=kevin_32b", KB, "resources.gpus_per_node=2"])))


def test_small_models_pass_and_the_check_can_be_switched_off():
    check_resources(compose_train(["model=smollm2_135m"]))
    check_resources(compose_train(["experiment=kevin_32b", KB, "resources.check=false"]))


def test_the_entry_point_refuses_before_any_step_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "experiment=kevin_32b", "tasks=builtin",
                           f"hydra.run.dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[0].startswith("error: model=32b")
    assert "Traceback" not in proc.stderr and not tmp_path.joinpath("turns.jsonl").exists()
