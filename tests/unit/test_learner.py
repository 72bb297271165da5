"""The learner's update on the tiny model: zero-advantage samples are skipped without changing the update."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.config import AlgorithmConfig, ModelConfig, TrainerConfig
from kevin_exp.models import load_policy
from kevin_exp.rollout.generation import HFGenerator
from kevin_exp.trainer.learner import LearnerSample, TorchLearner


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(name="tiny", source="tiny"))


def _update(tiny, advantages: list[float], normalization: str) -> tuple[float, torch.Tensor]:
    model = load_policy(ModelConfig(name="tiny", source="tiny")).model
    learner = TorchLearner(model, tiny.tokenizer.pad_token_id, TrainerConfig(minibatches=1, micro_batch_size=1, lr=1e-3),
                      AlgorithmConfig(), max_new_tokens=8, total_steps=1,
                      device=torch.device("cpu"), normalization=normalization)
    samples = [LearnerSample([1, 2, 3 + k], [5 + k, 6, 7, 8][: 2 + k], a) for k, a in enumerate(advantages)]
    stats = learner.update(samples, seed=0)
    return stats.grad_norm, model.lm_head.weight.detach().clone()


@pytest.mark.parametrize("normalization", ["constant", "token", "sequence"])
def test_skipping_zero_advantage_samples_keeps_the_update_exact(tiny, normalization):
    skipped_norm, skipped_w = _update(tiny, [1.0, 0.0, -0.5], normalization)
    full_norm, full_w = _update(tiny, [1.0, 1e-30, -0.5], normalization)
    # were the skipped sample left out of the normaliser, the gradient would grow by about a third
    assert skipped_norm == pytest.approx(full_norm, rel=1e-4)
    assert torch.allclose(skipped_w, full_w, atol=1e-7)


def test_an_all_zero_batch_still_counts_as_an_optimizer_step(tiny):
    model = load_policy(ModelConfig(name="tiny", source="tiny")).model
    learner = TorchLearner(model, tiny.tokenizer.pad_token_id, TrainerConfig(minibatches=2), AlgorithmConfig(),
                      max_new_tokens=8, total_steps=1, device=torch.device("cpu"), normalization="constant")
    stats = learner.update([LearnerSample([1, 2], [3, 4], 0.0), LearnerSample([1, 2], [5], 0.0)], seed=0)
    assert stats.gradient_steps == 2 and stats.grad_norm == 0.0
    state = learner.optimizer.state[model.lm_head.weight]
    assert int(state["step"]) == 2


def _sampled_batch(policy, temperature: float, top_p: float) -> list[LearnerSample]:
    gens = HFGenerator(policy, batch_size=3).generate([[1, 2, 3], [4, 5, 6, 7], [8, 9]], 12, temperature, top_p, seed=7)
    return [LearnerSample(g.prompt_ids, g.response_ids, advantage=1.0 - k, sampled_logprobs=g.logprobs)
            for k, g in enumerate(gens)]


def _logprob_diff(policy, samples, temperature: float, top_p: float) -> tuple[float, float]:
    learner = TorchLearner(policy.model, policy.tokenizer.pad_token_id, TrainerConfig(minibatches=1), AlgorithmConfig(),
                           max_new_tokens=12, total_steps=1, device=torch.device("cpu"), normalization="constant", temperature=temperature,
                           top_p=top_p)
    stats = learner.update(samples, seed=0)
    return stats.logprob_diff_mean, stats.logprob_diff_max


def test_the_learner_scores_tokens_under_the_distribution_they_were_sampled_from():
    """Generator and learner agree on every sampled token's log-prob (temperature 0.7, top-p 0.9, fp32)."""
    policy = load_policy(ModelConfig(name="tiny", source="tiny"))
    samples = _sampled_batch(policy, temperature=0.7, top_p=0.9)
    assert all(len(s.sampled_logprobs) == len(s.response_ids) > 0 for s in samples)
    mean, worst = _logprob_diff(policy, samples, temperature=0.7, top_p=0.9)
    assert worst < 1e-4 and mean < 1e-5


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.9), (0.7, 1.0)])
def test_a_learner_that_ignores_the_sampling_settings_shows_in_logprob_diff(temperature, top_p):
    policy = load_policy(ModelConfig(name="tiny", source="tiny"))
    samples = _sampled_batch(policy, temperature=0.7, top_p=0.9)
    mean, worst = _logprob_diff(policy, samples, temperature=temperature, top_p=top_p)
    assert worst > 1e-2, "a learner scoring another distribution than the sampler's must show in logprob_diff"
