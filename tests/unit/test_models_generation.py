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
from kevin_exp.rollout.generation import Generation, HFGenerator, call_seed, plan_calls
from kevin_exp.trainer.logprobs import pack, response_logprobs

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


def _random_prompts(policy: Policy, lengths: tuple[int, ...] = (3, 11, 6, 17, 1, 9, 4)) -> list[list[int]]:
    """Prompts of random tokens: the tiny model's greedy answers to them differ from row to row (to the chat
    prompts it answers newlines only)."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(100, len(policy.tokenizer), (n,), generator=generator).tolist() for n in lengths]


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


def test_calls_are_grouped_by_length_within_both_budgets():
    lengths = [3, 11, 6, 17, 1, 9, 4, 11]
    for batch_size, batch_tokens in [(1, 0), (3, 0), (8, 0), (8, 60), (4, 45), (8, 10)]:
        calls = plan_calls(lengths, 12, batch_size, batch_tokens)
        assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
        order = [i for call in calls for i in call]
        assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
        assert order.index(1) < order.index(7)  # stable among equal lengths
        for call in calls:
            padded = len(call) * (max(lengths[i] for i in call) + 12)
            assert len(call) <= batch_size
            assert batch_tokens == 0 or padded <= batch_tokens or len(call) == 1
    # longest + 12 = 29, 23, 18, 13: 2*29, 2*23 and 3*18 fit in 60; 3*29, 3*23 and 4*18 do not
    assert plan_calls(lengths, 12, 8, 60) == [[3, 1], [7, 5], [2, 6, 0], [4]]
    assert plan_calls(lengths, 12, 2, 0) == [[3, 1], [7, 5], [2, 6], [0, 4]]
    assert [len(c) for c in plan_calls(lengths, 12, 8, 10)] == [1] * 8  # every prompt is over budget alone
    assert call_seed(7, 1) == call_seed(7, 1) and len({call_seed(7, 1), call_seed(8, 0), call_seed(7, 0)}) == 3


@pytest.mark.parametrize("batch_size, batch_tokens", [(8, 0), (3, 0), (8, 60), (2, 45), (8, 1)])
def test_batched_greedy_output_equals_one_prompt_at_a_time(tiny: Policy, batch_size: int, batch_tokens: int):
    prompts = _random_prompts(tiny)
    alone = HFGenerator(tiny, batch_size=1).generate(prompts, 12, temperature=0.0, top_p=1.0, seed=0)
    assert len({tuple(g.response_ids) for g in alone}) > 1  # the rows' answers differ, so order is checked
    batched = HFGenerator(tiny, batch_size, batch_tokens).generate(prompts, 12, temperature=0.0, top_p=1.0, seed=3)
    assert [g.prompt_ids for g in batched] == prompts  # input order
    assert [g.response_ids for g in batched] == [g.response_ids for g in alone]
    assert all(len(g.logprobs) == len(g.response_ids) for g in batched)


def test_sampled_logprobs_equal_the_learners_with_grouped_padded_calls(tiny: Policy):
    """logprob_diff near 0 in fp32: the recorded log-prob of every sampled token (temperature 0.7, top-p 0.9)
    equals what the learner's scoring gives the same tokens, with prompts grouped into padded calls."""
    prompts = _random_prompts(tiny)
    gens = HFGenerator(tiny, batch_size=3, batch_tokens=70).generate(prompts, 16, temperature=0.7, top_p=0.9, seed=5)
    assert [g.prompt_ids for g in gens] == prompts
    assert all(len(g.logprobs) == len(g.response_ids) > 0 for g in gens)
    batch = pack([g.prompt_ids for g in gens], [g.response_ids for g in gens], tiny.tokenizer.pad_token_id,
                 torch.device("cpu"))
    with torch.no_grad():
        scored, _ = response_logprobs(tiny.model, batch, temperature=0.7, top_p=0.9)
    width = batch.mask.shape[1]
    for row, gen in enumerate(gens):
        learner = scored[row, width - len(gen.response_ids):]
        assert float((learner - torch.tensor(gen.logprobs)).abs().max()) < 1e-4


def test_a_stop_string_ends_the_response_where_it_completes(tiny: Policy):
    prompts = _random_prompts(tiny)
    plain = HFGenerator(tiny, batch_size=8).generate(prompts, 16, temperature=0.0, top_p=1.0, seed=0)
    decode = tiny.tokenizer.decode
    # a stop string across the earliest change of token in a response: its first occurrence is mid-response
    changes = {row: next(k for k in range(1, len(g.response_ids)) if g.response_ids[k] != g.response_ids[0])
               for row, g in enumerate(plain) if len(set(g.response_ids)) > 1}
    row = min(changes, key=changes.get)
    source, change = plain[row], changes[row]
    boundary = len(decode(source.response_ids[:change]))
    stop = decode(source.response_ids)[boundary - 2:boundary + 1]
    assert len(stop) == 3 and stop.strip()

    stopped = HFGenerator(tiny, batch_size=8, stop=[stop]).generate(prompts, 16, temperature=0.0, top_p=1.0, seed=0)
    hits = 0
    for before, after in zip(plain, stopped):
        # the first token after which the decoded response holds the stop string
        end = next((k for k in range(len(before.response_ids)) if stop in decode(before.response_ids[:k + 1])), None)
        assert len(after.logprobs) == len(after.response_ids)
        if end is None:
            assert after.response_ids == before.response_ids and after.text == before.text
            continue
        hits += 1
        assert after.response_ids == before.response_ids[:end + 1]
        text = decode(after.response_ids)
        assert after.text == text[:text.index(stop)] and stop not in after.text
        assert not after.truncated
    assert hits >= 1 and stopped[row].response_ids == source.response_ids[:change + 1]


def test_compiled_static_cache_decoding_gives_the_same_greedy_tokens(tiny: Policy):
    prompts = _random_prompts(tiny)
    plain = HFGenerator(tiny, batch_size=8).generate(prompts, 12, temperature=0.0, top_p=1.0, seed=0)
    compiled = HFGenerator(tiny, batch_size=8, compile=True).generate(prompts, 12, temperature=0.0, top_p=1.0, seed=0)
    assert [g.response_ids for g in compiled] == [g.response_ids for g in plain]
    assert all(len(g.logprobs) == len(g.response_ids) for g in compiled)


@pytest.mark.parametrize("kwargs, named", [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": -2}, "batch_size"), ({"batch_tokens": -1}, "batch_tokens"),
    ({"stop": [""]}, "stop"), ({"stop": ["ok", ""]}, "stop"), ({"stop": "</answer>"}, "stop"),
])
def test_bad_generator_arguments_are_refused_by_name(tiny: Policy, kwargs: dict, named: str):
    with pytest.raises(ValueError, match=rf"^{named}="):
        HFGenerator(tiny, **kwargs)


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
