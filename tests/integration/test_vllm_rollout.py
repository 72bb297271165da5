"""rollout=vllm end to end on CPU, with the test double of vLLM 0.33's API in place of vLLM (which needs a CUDA
GPU): a training run through the entry point, and two gloo ranks of ZeRO-3 pushing their weights to their
engines."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin_exp.records.run_records import read_jsonl
from tests.integration.deepspeed_ranks import REPO, run_ranks

DOUBLE = REPO / "tests" / "vllm_double"
pytestmark = pytest.mark.slow


def _double_env(log: Path) -> dict[str, str]:
    env = dict(os.environ, KX_VLLM_DOUBLE_LOG=str(log), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(DOUBLE), str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_a_training_run_with_rollout_vllm_follows_the_lifecycle_and_records_it(tmp_path):
    out, log = tmp_path / "run", tmp_path / "engine.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "kevin_exp.train", "model=tiny", "rollout=vllm", "rollout.env=synthetic",
         "steps=2", "tasks_per_step=2", "n_trajectories=2", "n_turns=2",
         "rollout.max_new_tokens=8", "rollout.max_prompt_tokens=256", "trainer.device=cpu", "logger.progress=none",
         "trainer.lr=1e-2", f"hydra.run.dir={out}"],
        cwd=REPO, env=_double_env(log), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({c["engine"] for c in calls}) == 1  # one engine for the run
    seq = [c["call"] + (f"({c['level']})" if c["call"] == "sleep" else
                        f"({','.join(c['tags'])})" if c["call"] == "wake_up" else "") for c in calls]
    seq = [s for i, s in enumerate(seq) if s != "load_weights" or seq[i - 1] != "load_weights"]
    turn = ["wake_up(kv_cache)", "generate", "sleep(0)", "release_kv_cache_memory"]
    step = ["wake_up(weights)", "load_weights", *turn, *turn, "sleep(2)"]
    assert seq == ["init", "sleep(2)", *step, *step]
    init = calls[0]["kwargs"]
    assert init["distributed_executor_backend"] == "external_launcher" and init["logprobs_mode"] == "processed_logprobs"
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for t in ("wake_weights", "push_weights", "wake_kv", "free_kv", "sleep"):
            assert m[f"vllm_{t}_s"] >= 0
        # the engine samples from the learner's distribution (fp32): their log-probs agree
        assert m["logprob_diff_max"] is not None and m["logprob_diff_max"] < 1e-4
    assert len(read_jsonl(out / "turns.jsonl")) == 2 * 2 * 2 * 2
    assert json.loads((out / "config.json").read_text())["rollout"]["vllm"]["gpu_memory_utilization"] == 0.35


@pytest.fixture(scope="module")
def push_runs(tmp_path_factory) -> dict[int, list[dict]]:
    runs = {}
    for world in (2, 1):
        out = tmp_path_factory.mktemp(f"push{world}")
        env_path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(DOUBLE), env_path])
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            run_ranks("vllm_push_worker.py", [str(out)], world, out)
        finally:
            os.environ["PYTHONPATH"] = env_path
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        runs[world] = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return runs


def test_two_zero3_ranks_push_the_learners_whole_weights_to_their_engines(push_runs):
    ranks = push_runs[2]
    for r, result in enumerate(ranks):
        for k, round_ in enumerate(result["rounds"]):
            assert round_["engine"].keys() == round_["learner"].keys()
            for name, value in round_["learner"].items():
                assert value.numel() > 0 and torch.equal(round_["engine"][name], value), (r, k, name)
    # every rank's engine got the same (whole) weights, and they changed with training
    for name, value in ranks[0]["rounds"][1]["engine"].items():
        assert torch.equal(ranks[1]["rounds"][1]["engine"][name], value)
    assert any(not torch.equal(ranks[0]["rounds"][0]["engine"][n], v) for n, v in ranks[0]["rounds"][1]["engine"].items())
    # the engines sampled from their own seeds: the ranks' responses differ
    assert ranks[0]["rounds"][0]["tokens"] != ranks[1]["rounds"][0]["tokens"]


def test_the_pushed_weights_of_two_ranks_are_those_of_one(push_runs):
    """Before training the engines hold the initial weights exactly. After a step, fp32: the ranks sum each
    gradient's terms in another order, and Adam divides a gradient by its own magnitude, so an element whose
    gradient is near Adam's eps moves by anything up to the step's lr (3.3e-3 in the first, warm-up step) apart
    (1e-4 seen on one element in 16k). Such elements are rare; a sample lost or counted twice moves every weight
    it touches (each dense weight, its tokens' rows) by the order of the lr: far more than 0.1% of a tensor's
    elements (or two of a small one) beyond 1e-4."""
    two, one = push_runs[2][0], push_runs[1][0]
    for name, value in one["rounds"][0]["engine"].items():
        assert torch.equal(two["rounds"][0]["engine"][name], value), name
    for name, value in one["rounds"][1]["engine"].items():
        apart = (two["rounds"][1]["engine"][name] - value).abs()
        beyond = int((apart > 1e-4).sum())
        assert beyond <= max(2, apart.numel() // 1000) and apart.max().item() <= 2 * 3.3e-3, (name, beyond, apart.max())


def test_the_consolidated_state_without_a_whole_copy_is_gathered_on_rank_0(push_runs):
    rank0, rank1 = push_runs[2]
    assert rank1["consolidated"] is None
    state = rank0["consolidated"]
    for name, value in rank0["final"].items():
        assert torch.equal(state[name], value), name
