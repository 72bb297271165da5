"""Policy loading and batched generation with real models: the tiny random Llama and SmolLM2-135M.

The first SmolLM2 load dequantises the GGUF and writes a converted copy (~30 s); set KEVIN_EXP_CACHE to
keep that copy across sessions, as for the build cache.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from kevin_exp.config import ModelConfig
from kevin_exp.models import ModelConfigError, Policy, chat_prompt_ids, load_policy, smollm2_cache_dir
from kevin_exp.rollout.generation import Generation, HFGenerator

QUESTIONS = ["What is 2+2?", "Name a color.", "Say hi.", "List three fruits, comma separated.", "What is CUDA?"]


@pytest.fixture(scope="session")
def model_cache(build_cache: Path) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KEVIN_EXP_CACHE", str(build_cache))
        yield build_cache


@pytest.fixture(scope="session")
def tiny(model_cache: Path) -> Policy:
    return load_policy(ModelConfig(source="tiny", name="tiny"))


@pytest.fixture(scope="session")
def smollm2(model_cache: Path) -> Policy:
    return load_policy(ModelConfig())


def _prompts(policy: Policy, questions: list[str] = QUESTIONS) -> list[list[int]]:
    return [chat_prompt_ids(policy.tokenizer, q) for q in questions]


def _check_generation(gen: Generation, prompt: list[int], max_new_tokens: int, eos: int) -> None:
    assert gen.prompt_ids == prompt
    assert 0 < len(gen.response_ids) <= max_new_tokens
    assert eos not in gen.response_ids[:-1]
    if gen.truncated:
        assert len(gen.response_ids) == max_new_tokens and gen.response_ids[-1] != eos
    else:
        assert gen.response_ids[-1] == eos


def test_tiny_loads_with_matching_vocab(tiny: Policy):
    model, tok = tiny.model, tiny.tokenizer
    assert tiny.name == "tiny"
    assert model.config.vocab_size == len(tok) == model.get_input_embeddings().weight.shape[0]
    assert model.config.num_hidden_layers == ModelConfig().tiny_layers
    assert tok.pad_token_id is not None and tok.padding_side == "left"
    assert model.dtype == torch.float32 and not model.training


def test_tiny_init_is_deterministic_and_leaves_rng_alone(tiny: Policy):
    state = torch.get_rng_state()
    again = load_policy(ModelConfig(source="tiny", name="tiny"))
    assert torch.equal(torch.get_rng_state(), state)
    for a, b in zip(tiny.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)


def test_chat_prompt_ids_round_trip(tiny: Policy):
    ids = chat_prompt_ids(tiny.tokenizer, "Write a fast softmax kernel.", system_prompt="You write CUDA.")
    text = tiny.tokenizer.decode(ids)
    assert "Write a fast softmax kernel." in text and "You write CUDA." in text
    assert text.index("You write CUDA.") < text.index("Write a fast softmax kernel.")
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt


def test_generation_lengths_order_and_truncation(tiny: Policy):
    prompts = _prompts(tiny)
    gens = HFGenerator(tiny, batch_size=2).generate(prompts, max_new_tokens=12, temperature=1.0, top_p=1.0, seed=0)
    assert len(gens) == len(prompts)
    for gen, prompt in zip(gens, prompts):
        _check_generation(gen, prompt, 12, tiny.tokenizer.eos_token_id)
        assert gen.text == tiny.tokenizer.decode(gen.response_ids, skip_special_tokens=True)


def test_left_padding_does_not_change_greedy_output(tiny: Policy):
    prompts = _prompts(tiny)
    gen = HFGenerator(tiny, batch_size=8)
    batched = gen.generate(prompts, 8, temperature=0.0, top_p=1.0, seed=0)
    alone = [gen.generate([p], 8, temperature=0.0, top_p=1.0, seed=0)[0] for p in prompts]
    assert [g.response_ids for g in batched] == [g.response_ids for g in alone]


def test_seeded_sampling_is_reproducible_and_leaves_rng_alone(tiny: Policy):
    gen, prompts = HFGenerator(tiny, batch_size=2), _prompts(tiny)
    state = torch.get_rng_state()
    first = gen.generate(prompts, 10, temperature=1.0, top_p=0.95, seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(1234)  # the caller's RNG must not matter either
    again = gen.generate(prompts, 10, temperature=1.0, top_p=0.95, seed=7)
    other = gen.generate(prompts, 10, temperature=1.0, top_p=0.95, seed=8)
    assert [g.response_ids for g in first] == [g.response_ids for g in again]
    assert [g.response_ids for g in first] != [g.response_ids for g in other]


def test_generate_restores_train_mode(tiny: Policy):
    tiny.model.train()
    try:
        HFGenerator(tiny).generate(_prompts(tiny)[:1], 2, temperature=1.0, top_p=1.0, seed=0)
        assert tiny.model.training
    finally:
        tiny.model.eval()


def test_smollm2_greedy_generation(smollm2: Policy):
    assert smollm2.name == "smollm2_135m" and smollm2.model.config.vocab_size == len(smollm2.tokenizer)
    prompts = _prompts(smollm2, QUESTIONS[:3])
    gens = HFGenerator(smollm2, batch_size=4).generate(prompts, 24, temperature=0.0, top_p=1.0, seed=0)
    eos = smollm2.tokenizer.eos_token_id
    for gen, prompt in zip(gens, prompts):
        _check_generation(gen, prompt, 24, eos)
        assert gen.text.strip()
    assert "4" in gens[0].text and not gens[0].truncated  # "What is 2+2?" is answered in a few tokens


def test_smollm2_second_load_reads_the_cache(smollm2: Policy, model_cache: Path):
    folder = smollm2_cache_dir()
    assert folder.parent == model_cache / "models"
    assert (folder / "model" / "model.safetensors").is_file() and (folder / "tokenizer").is_dir()
    again = load_policy(ModelConfig())
    for a, b in zip(smollm2.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)


def test_bad_source_and_missing_hf_path_raise(tmp_path: Path):
    with pytest.raises(ModelConfigError, match="model.source"):
        load_policy(ModelConfig(source="gguf"))
    with pytest.raises(ModelConfigError, match="model.path"):
        load_policy(ModelConfig(source="hf", path=None))
    with pytest.raises(ModelConfigError, match="model.path"):
        load_policy(ModelConfig(source="hf", path=os.fspath(tmp_path / "no_such_model")))
