"""The vLLM generator against the test double of vLLM 0.33's API (tests/vllm_double): the engine's arguments,
its lifecycle in the order the paper ran it, pushed weights, per-rank and per-request seeds, processed log-probs,
stop strings, and the settings refused at composition."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kevin_exp.config import ConfigError, ModelConfig, RolloutConfig, VLLMConfig
from kevin_exp.launch.world import DistContext
from kevin_exp.models import Policy, chat_prompt_ids, load_policy
from kevin_exp.rollout.vllm_engine import VLLMGenerator, engine_args, engine_seed
from kevin_exp.trainer.logprobs import pack, response_logprobs
from tests.helpers import compose_train


@pytest.fixture(scope="module")
def tiny() -> Policy:
    return load_policy(ModelConfig(source="tiny", name="tiny"))


def _generator(vllm, policy: Policy, rollout: RolloutConfig | None = None, rank: int = 0, seed: int = 0) -> VLLMGenerator:
    rollout = rollout or RolloutConfig(backend="vllm", max_prompt_tokens=96, max_new_tokens=16)
    return VLLMGenerator(rollout, ModelConfig(source="tiny", name="tiny"), policy, DistContext(rank=rank), seed,
                         torch.device("cpu"), dist_timeout_s=60, vllm_module=vllm)


def _prompts(policy: Policy) -> list[list[int]]:
    return [chat_prompt_ids(policy.tokenizer, q) for q in ("Write a kernel.", "Say hi.", "What is 2+2?")]


def _calls(vllm, engine) -> list[tuple]:
    out = []
    for owner, call, details in vllm.LLM.log:
        if owner != id(engine):
            continue
        if call == "load_weights":
            call_entry = ("load_weights",)
        elif call in ("sleep",):
            call_entry = (call, details["level"])
        elif call == "wake_up":
            call_entry = (call, tuple(details["tags"] or ()))
        else:
            call_entry = (call,)
        if not out or out[-1] != call_entry or call_entry[0] != "load_weights":
            out.append(call_entry)
    return out


def test_engine_arguments_follow_the_settings():
    v = RolloutConfig(backend="vllm", max_prompt_tokens=100, max_new_tokens=20)
    args = engine_args(v, ModelConfig(dtype="bfloat16"), Path("/m"), seed=7)
    assert args["distributed_executor_backend"] == "external_launcher" and args["enable_sleep_mode"] is True
    assert args["logprobs_mode"] == "processed_logprobs" and args["load_format"] == "dummy"
    assert args["gpu_memory_utilization"] == 0.35 and "kv_cache_memory_bytes" not in args
    assert args["max_model_len"] == 120 and args["dtype"] == "bfloat16" and args["seed"] == 7
    kv = RolloutConfig(backend="vllm", vllm=VLLMConfig(gpu_memory_utilization=None, kv_cache_memory_bytes=2 << 30,
                                                          max_model_len=4096))
    args = engine_args(kv, ModelConfig(), Path("/m"), seed=0)
    assert args["kv_cache_memory_bytes"] == 2 << 30 and "gpu_memory_utilization" not in args
    assert args["max_model_len"] == 4096


def test_each_rank_gets_its_own_engine_seed(vllm_double, tiny):
    seeds = {engine_seed(0, r) for r in range(8)}
    assert len(seeds) == 8 and engine_seed(1, 0) not in seeds
    a, b = _generator(vllm_double, tiny, rank=0), _generator(vllm_double, tiny, rank=1)
    assert a.llm.seed == engine_seed(0, 0) and b.llm.seed == engine_seed(0, 1)


def test_the_step_lifecycle_runs_in_the_papers_order(vllm_double, tiny):
    gen = _generator(vllm_double, tiny)
    prompts = _prompts(tiny)
    with pytest.raises(RuntimeError, match="pushed"):
        gen.generate(prompts, 8, 0.9, 1.0, seed=1)
    with pytest.raises(RuntimeError, match="wake"):
        gen.update_weights(tiny.model.named_parameters())
    for _ in range(2):  # two steps
        gen.wake()
        gen.update_weights(tiny.model.named_parameters())
        for turn in range(2):
            gen.generate(prompts, 8, 0.9, 1.0, seed=turn)
        gen.sleep()
    turn = [("wake_up", ("kv_cache",)), ("generate",), ("sleep", 0), ("release_kv_cache_memory",)]
    step = [("wake_up", ("weights",)), ("load_weights",), *turn, *turn, ("sleep", 2)]
    assert _calls(vllm_double, gen.llm) == [("init",), ("sleep", 2), *step, *step]
    stats = gen.pop_stats()
    assert set(stats) == {f"vllm_{t}_s" for t in ("wake_weights", "push_weights", "wake_kv", "free_kv", "sleep")}
    assert all(v >= 0 for v in stats.values()) and gen.pop_stats() == {}


def test_pushed_weights_are_the_learners(vllm_double, tiny):
    gen = _generator(vllm_double, tiny)
    gen.wake()
    gen.update_weights(tiny.model.named_parameters())
    engine = dict(gen.llm.model.named_parameters())
    for name, param in tiny.model.named_parameters():
        assert torch.equal(engine[name], param), name
    # a level-2 sleep discards them: generating without a new push is refused (the double is strict)
    gen.sleep()
    gen.llm.wake_up(tags=["weights", "kv_cache"])
    with pytest.raises(RuntimeError, match="never reloaded"):
        gen.llm.generate([{"prompt_token_ids": [1, 2]}], vllm_double.SamplingParams(max_tokens=2))


def test_samples_depend_on_the_seed_and_log_probs_are_the_learners(vllm_double, tiny):
    gen = _generator(vllm_double, tiny)
    gen.wake()
    gen.update_weights(tiny.model.named_parameters())
    prompts = _prompts(tiny)
    first = gen.generate(prompts, 12, 0.7, 0.9, seed=5)
    again = gen.generate(prompts, 12, 0.7, 0.9, seed=5)
    other = gen.generate(prompts, 12, 0.7, 0.9, seed=6)
    assert [g.response_ids for g in first] == [g.response_ids for g in again]
    assert [g.response_ids for g in first] != [g.response_ids for g in other]
    batch = pack([g.prompt_ids for g in first], [g.response_ids for g in first], tiny.tokenizer.pad_token_id,
                 torch.device("cpu"))
    with torch.no_grad():
        learner, _ = response_logprobs(tiny.model, batch, temperature=0.7, top_p=0.9)
    for row, g in enumerate(first):
        assert len(g.logprobs) == len(g.response_ids) > 0
        diff = (torch.tensor(g.logprobs) - learner[row, : len(g.response_ids)]).abs().max()
        assert diff < 1e-4, diff


def test_stop_strings_end_a_response(vllm_double, tiny):
    plain = _generator(vllm_double, tiny)
    plain.wake()
    plain.update_weights(tiny.model.named_parameters())
    prompts = _prompts(tiny)[:1]
    text = plain.generate(prompts, 16, 1.0, 1.0, seed=0)[0].text
    # two visible characters from the second half of a sampled response
    start = next(i for i in range(len(text) // 2, len(text) - 1) if not text[i:i + 2].isspace() and len(text[i:i + 2].strip()) == 2)
    stop = text[start:start + 2]
    rollout = RolloutConfig(backend="vllm", max_prompt_tokens=96, max_new_tokens=16, stop=[stop])
    gen = _generator(vllm_double, tiny, rollout)
    gen.wake()
    gen.update_weights(tiny.model.named_parameters())
    cut = gen.generate(prompts, 16, 1.0, 1.0, seed=0)[0]
    assert stop not in cut.text and text.startswith(cut.text) and not cut.truncated
    assert stop in tiny.tokenizer.decode(cut.response_ids, skip_special_tokens=True)
    assert len(cut.logprobs) == len(cut.response_ids) < 16


# ---------------------------------------------------------------------- settings refused at composition
def test_rollout_vllm_composes_with_vllm_installed(vllm_double, tmp_path):
    cfg = compose_train(["rollout=vllm", "model=tiny"], tmp_path)
    assert cfg.rollout.backend == "vllm" and cfg.rollout.vllm.gpu_memory_utilization == 0.35


def test_rollout_vllm_without_vllm_is_refused_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "vllm_double" not in p])
    with pytest.raises(ConfigError, match=r"rollout.backend=vllm: vLLM is not installed; pip install -e '.\[vllm\]'"):
        compose_train(["rollout=vllm", "model=tiny"], tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.vllm.kv_cache_memory_bytes=1000000"], "set exactly one of them"),
    (["rollout.vllm.gpu_memory_utilization=null"], "set exactly one of them"),
    (["rollout.vllm.gpu_memory_utilization=1.5"], r"rollout.vllm.gpu_memory_utilization=1.5: expected a number in \(0, 1\)"),
    (["rollout.vllm.gpu_memory_utilization=null", "rollout.vllm.kv_cache_memory_bytes=-5"],
     "rollout.vllm.kv_cache_memory_bytes=-5: expected > 0"),
    (["rollout.vllm.gpu_memory_utilization=null", "rollout.vllm.kv_cache_memory_bytes=200000000000"],
     "more than the GPU"),
    (["rollout.vllm.tensor_parallel_size=2"], "tensor_parallel_size=2: not implemented yet"),
    (["rollout.vllm.max_model_len=100"], "max_model_len=100: shorter than"),
    (["rollout.compile=true"], "rollout.compile=true: a setting of the hf backend"),
])
def test_bad_engine_settings_are_refused(vllm_double, tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_train(["rollout=vllm", "model=tiny", *overrides], tmp_path)
