"""The step's MFU estimate and the batching the distributed step uses."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.run.step import rank_share
from kevin_exp.run.throughput import device_peak_flops, mfu, peak_flops
from kevin_exp.trainer.batching import minibatch_plan, token_micro_batches


@pytest.mark.parametrize("name,flops", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("Tesla T4", None)])
def test_peak_flops_by_device_name(name, flops):
    assert peak_flops(name) == flops


def test_mfu_is_six_n_tokens_over_time_and_peak():
    # 3e9 parameters, 1e4 tokens in 1 s on 2 GPUs of 989 TFLOP/s
    assert mfu(3_000_000_000, 10_000, 1.0, 989e12, 2) == pytest.approx(6 * 3e9 * 1e4 / 1.0 / (2 * 989e12))
    assert mfu(10, 10, 1.0, None, 1) is None
    assert device_peak_flops(torch.device("cpu")) is None


def test_micro_batches_fit_the_token_budget_and_keep_the_order():
    lengths = [5, 3, 9, 2, 2, 20]
    micros = token_micro_batches(range(6), lengths, budget=10)
    assert [i for m in micros for i in m] == list(range(6))
    for m in micros:
        assert len(m) == 1 or len(m) * max(lengths[i] for i in m) <= 10
    assert micros[-1] == [5]  # longer than the budget: alone


def test_the_minibatch_plan_covers_every_sample_once_per_epoch():
    plan = minibatch_plan(7, minibatches=2, epochs=2, seed=3)
    assert len(plan) == 4
    assert sorted(plan[0] + plan[1]) == list(range(7)) == sorted(plan[2] + plan[3])
    assert minibatch_plan(7, 2, 2, 3) == plan


def test_ranks_take_contiguous_whole_shares_of_the_tasks():
    tasks = list("abcdefgh")
    assert [rank_share(tasks, r, 4) for r in range(4)] == [list("ab"), list("cd"), list("ef"), list("gh")]
    assert [t for r in range(3) for t in rank_share(tasks, r, 3)] == tasks
