"""trainer.checkpoint_layers: which decoder layers stay checkpointed, and that the gradients do not change."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kevin_exp.config import AlgorithmConfig, ModelConfig, TrainerConfig
from kevin_exp.models import load_policy
from kevin_exp.models.partial_checkpointing import checkpointed_layer_indices, checkpointing_layers, limit_checkpointing
from kevin_exp.settings_checks import check_settings
from kevin_exp.trainer.learner import LearnerSample, TorchLearner


@pytest.mark.parametrize(("n", "fraction", "expected"), [
    (8, 0.5, [1, 3, 5, 7]),
    (8, 0.25, [2, 6]),
    (8, 1.0, list(range(8))),
    (8, 0.0, []),
    (36, 0.75, [i for i in range(36) if i % 4 != 1]),
])
def test_the_checkpointed_layers_are_spread_over_the_depth(n, fraction, expected):
    assert checkpointed_layer_indices(n, fraction) == expected


def _checkpointed(fraction: float) -> torch.nn.Module:
    model = load_policy(ModelConfig(name="tiny", source="tiny", gradient_checkpointing=True)).model
    if fraction < 1.0:
        limit_checkpointing(model, fraction)
    return model


def test_limit_turns_checkpointing_off_on_the_other_layers():
    model = _checkpointed(0.5)
    flags = [layer.gradient_checkpointing for layer in checkpointing_layers(model)]
    n = len(flags)
    assert n == model.config.num_hidden_layers and n >= 2
    assert [i for i, on in enumerate(flags) if on] == checkpointed_layer_indices(n, 0.5)
    assert not all(flags) and any(flags)


def _grads(fraction: float) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = _checkpointed(fraction)
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fraction", [0.5, 0.0])
def test_partial_checkpointing_keeps_the_loss_and_gradients(fraction):
    full_loss, full = _grads(1.0)
    loss, grads = _grads(fraction)
    assert loss == pytest.approx(full_loss, rel=1e-6)
    assert grads.keys() == full.keys() and len(grads) > 0
    for name, g in grads.items():
        assert torch.allclose(g, full[name], atol=1e-6, rtol=1e-5), name


def test_the_torch_learner_applies_it():
    policy = load_policy(ModelConfig(name="tiny", source="tiny", gradient_checkpointing=True))
    learner = TorchLearner(policy.model, policy.tokenizer.pad_token_id,
                           TrainerConfig(minibatches=1, micro_batch_size=2, checkpoint_layers=0.5), AlgorithmConfig(),
                           max_new_tokens=4, total_steps=1, device=torch.device("cpu"), normalization="constant")
    flags = [layer.gradient_checkpointing for layer in checkpointing_layers(learner.model)]
    assert [i for i, on in enumerate(flags) if on] == checkpointed_layer_indices(len(flags), 0.5)
    stats = learner.update([LearnerSample([1, 2, 3], [4, 5, 6], 1.0), LearnerSample([1, 2], [7, 8], -1.0)], seed=0)
    assert stats.grad_norm > 0


def test_out_of_range_and_without_checkpointing_are_refused():
    assert any("checkpoint_layers" in p for p in check_settings(TrainerConfig(checkpoint_layers=1.5)))
    off = TrainerConfig(backend="deepspeed", activation_checkpointing=False, checkpoint_layers=0.5)
    assert any("activation_checkpointing=false" in p for p in check_settings(off))


def test_the_memory_estimate_counts_the_layers_left_out():
    from kevin_exp.launch.resources import MemoryLayout, _activation_bytes

    x = MemoryLayout(model="m", params_b=3.0, layers=36, hidden=2048, intermediate=11008, vocab=151936, kv_dim=256,
                     dtype="bfloat16", backend="deepspeed", micro_batch_tokens=4096)
    full = _activation_bytes(x, 2)
    half = _activation_bytes(dataclasses.replace(x, checkpoint_layers=0.5), 2)
    none = _activation_bytes(dataclasses.replace(x, activation_checkpointing=False), 2)
    assert full < half < none
    assert _activation_bytes(dataclasses.replace(x, checkpoint_layers=0.0), 2) == none
