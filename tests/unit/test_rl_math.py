"""Returns, advantages, scores and loss normalisations against tables computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from kevin_exp.rl.advantages import estimators, get_estimator
from kevin_exp.rl.loss import aggregate, clipped_policy_loss
from kevin_exp.rl.returns import discounted_returns
from kevin_exp.rl.reward import turn_score

REWARDS = [1.0, 0.0, 2.0]


@pytest.mark.parametrize(
    "gamma, aggregation, expected",
    [
        (0.0, "sum", [1.0, 0.0, 2.0]),  # gamma 0: each turn its own score
        (1.0, "sum", [3.0, 2.0, 2.0]),  # gamma 1: undiscounted sum of this and later turns
        (0.4, "sum", [1.32, 0.8, 2.0]),  # R2 = 0 + .4*2; R1 = 1 + .4*.8
        (0.0, "max", [1.0, 0.0, 2.0]),
        (1.0, "max", [2.0, 2.0, 2.0]),
        (0.4, "max", [1.0, 0.8, 2.0]),  # R1 = max(1, .4*.8)
    ],
)
def test_discounted_returns(gamma, aggregation, expected):
    assert discounted_returns(REWARDS, gamma, aggregation) == pytest.approx(expected)


def test_returns_reject_bad_arguments():
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], 1.5)
    with pytest.raises(ValueError, match="aggregation"):
        discounted_returns([1.0], 0.4, "mean")


def test_turn_score():
    assert turn_score(True, 1.5) == pytest.approx(1.8)
    assert turn_score(True, 0.5) == pytest.approx(0.8)  # correct but slower still earns 0.3 + speedup
    assert turn_score(False, 3.0) == 0.0
    assert turn_score(True, None) == 0.0
    assert turn_score(True, 2.0, correctness_weight=1.0, speedup_weight=0.0) == 1.0


def test_grpo_group_normalisation_with_and_without_std():
    grpo = get_estimator("grpo")
    returns = [0.0, 0.0, 6.0, 1.0, 3.0]
    group = ["a", "a", "a", "b", "b"]
    s = math.sqrt(8.0)  # population std of (0, 0, 6)
    assert grpo(returns, group) == pytest.approx([-2 / s, -2 / s, 4 / s, -1.0, 1.0], abs=1e-5)
    assert grpo(returns, group, scale_by_std=False) == pytest.approx([-2.0, -2.0, 4.0, -1.0, 1.0])
    assert grpo([5.0, 5.0], ["a", "a"]) == pytest.approx([0.0, 0.0])  # no signal, no NaN


def test_trloo_leave_one_out_per_task_and_turn():
    trloo = get_estimator("trloo")
    returns = [1.0, 2.0, 3.0, 4.0, 8.0, 7.0]
    group = ["a", "a", "a", "a", "a", "b"]
    turn = [1, 1, 1, 2, 2, 1]
    assert trloo(returns, group, turn) == pytest.approx([-1.5, 0.0, 1.5, -4.0, 4.0, 0.0])


def test_registry_names_and_errors():
    assert {"grpo", "trloo"} <= set(estimators())
    with pytest.raises(ValueError, match="unknown"):
        get_estimator("ppo")


def _loss(normalization):
    logp = torch.zeros(2, 4)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    return clipped_policy_loss(logp, logp.clone(), adv, mask, normalization, max_new_tokens=4).loss.item()


@pytest.mark.parametrize("normalization, expected", [("constant", 6 / 8), ("token", 6 / 6), ("sequence", 0.5)])
def test_loss_normalisations(normalization, expected):
    # per-token loss is -A: row 0 contributes -1 x 2 tokens, row 1 contributes +2 x 4 tokens
    assert _loss(normalization) == pytest.approx(expected)


def test_clip_higher_bounds():
    old = torch.zeros(2, 1)
    new = torch.log(torch.tensor([[1.5], [0.5]]))
    adv = torch.tensor([1.0, -1.0])
    stats = clipped_policy_loss(new, old, adv, torch.ones(2, 1), "token", 1)
    # row 0: min(1.5, 1.28) = 1.28 -> -1.28; row 1: min(-0.5, -0.8) = -0.8 -> +0.8
    assert stats.loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert stats.clip_fraction == pytest.approx(1.0)


def test_kl_term_needs_reference_and_is_zero_at_reference():
    logp = torch.zeros(1, 3)
    with pytest.raises(ValueError):
        clipped_policy_loss(logp, logp, torch.ones(1), torch.ones(1, 3), "token", 3, kl_coef=0.1)
    stats = clipped_policy_loss(logp, logp, torch.zeros(1), torch.ones(1, 3), "token", 3, ref_logprobs=logp, kl_coef=0.1)
    assert stats.loss.item() == pytest.approx(0.0)


def test_aggregate_rejects_unknown_normalisation():
    with pytest.raises(ValueError, match="normalization"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "batch", 1)
@pytest.mark.parametrize("normalization", ["constant", "token", "sequence"])
def test_micro_batch_losses_sum_to_the_mini_batch_loss(normalization):
    """Gradient accumulation: micro-batch losses with the mini-batch's denominators add up exactly."""
    torch.manual_seed(0)
    per_token = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    mask[:, 0] = 1.0
    whole = aggregate(per_token, mask, normalization, max_new_tokens=8)
    parts = sum(
        aggregate(per_token[i : i + 2], mask[i : i + 2], normalization, 8, total_sequences=6, total_tokens=int(mask.sum()))
        for i in range(0, 6, 2)
    )
    assert torch.allclose(whole, parts)


def test_turn_credit_groups_by_trajectory_for_returns_and_by_task_for_advantages():
    from kevin_exp.rl.credit import turn_credit

    # task a: two trajectories of two turns (given out of order); task b: one trajectory
    scores = [0.0, 1.0, 2.0, 0.0, 5.0, 5.0]
    task = ["a", "a", "a", "a", "b", "b"]
    traj = [0, 0, 1, 1, 0, 0]
    turn = [1, 0, 0, 1, 0, 1]
    returns, adv = turn_credit(scores, task, traj, turn, gamma=0.5, scale_by_std=False)
    # traj a/0: turns (1.0, 0.0) -> R0 = 1 + 0.5*0 = 1, R1 = 0; traj a/1: (2, 0) -> 2, 0; b: (5, 5) -> 7.5, 5
    assert returns == [0.0, 1.0, 2.0, 0.0, 7.5, 5.0]
    assert adv == pytest.approx([-0.75, 0.25, 1.25, -0.75, 1.25, -1.25])
