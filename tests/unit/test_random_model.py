"""model.source=random: a model of the config's architecture numbers, built from a fixed seed on the target device."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.config import ModelConfig
from kevin_exp.errors import UserError
from kevin_exp.models import load_policy
from kevin_exp.models.loading import ModelConfigError, _random_model, load_tokenizer
from tests.helpers import compose_train


def test_a_qwen2_shape_builds_with_its_numbers_and_the_same_weights_every_time():
    cfg = compose_train(["model=qwen25_05b_random", "model.layers=2"]).model
    first, second = load_policy(cfg), load_policy(cfg)
    model = first.model
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.bfloat16
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None  # Qwen2's biases on q, k, v
    assert attn.k_proj.out_features == cfg.kv_heads * cfg.head_dim and attn.q_proj.out_features == cfg.hidden_size
    assert len(model.model.layers) == 2 and model.config.vocab_size == cfg.vocab_size
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), second.model.parameters()))


@pytest.mark.parametrize("name", ["qwen25_3b_random", "qwen25_05b_random"])
def test_the_shipped_shapes_have_the_parameter_count_the_memory_check_uses(name):
    cfg = compose_train([f"model={name}"]).model
    model = _random_model(cfg, load_tokenizer(cfg), torch.device("meta"), torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(cfg.params_b, rel=0.01)


@pytest.mark.parametrize("overrides, message", [
    (["model.heads=15"], "model.hidden_size=2048: expected heads x head_dim = 15 x 128"),
    (["model.kv_heads=3"], "model.kv_heads=3: expected a divisor of the 16 attention heads"),
    (["model.intermediate_size=0"], "model.intermediate_size: model.source=random builds the model from these"),
    (["model.arch=mistral"], "model.arch='mistral': expected one of llama, qwen2"),
])
def test_a_shape_that_cannot_build_is_refused_when_the_config_is_composed(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        compose_train(["model=qwen25_3b_random", *overrides])


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused_on_load():
    cfg = ModelConfig(name="r", source="random", layers=1, hidden_size=64, heads=4, kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=1000)
    with pytest.raises(ModelConfigError, match="model.vocab_size=1000 is smaller than the tokenizer's 49152"):
        load_policy(cfg)
