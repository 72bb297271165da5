"""Training runs of 2 ranks under trainer=deepspeed (ZeRO-3, CPU, gloo, real processes): a run killed mid-run
resumes and writes the rows an uninterrupted run writes; a 2-rank run continues as 1 rank."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from kevin_exp.records.rows import MEASURED_COLUMNS
from kevin_exp.records.run_records import read_jsonl
from kevin_exp.trainer.checkpoint import POLICY_FILE, find_checkpoint, load_policy_weights
from tests.integration.deepspeed_ranks import run_ranks, start_ranks

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

RUN = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "trainer=deepspeed",
       "trainer.bf16=false", "trainer.offload_optimizer=none", "trainer.activation_checkpointing=false",
       "trainer.dist_timeout_s=60", "trainer.micro_batch_tokens=48", "n_trajectories=3", "n_turns=2",
       "tasks_per_step=2", "rollout.max_new_tokens=8", "trainer.lr=1e-3", "trainer.warmup_ratio=0"]
STEPS = 3


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in {*MEASURED_COLUMNS, "run_id"}} for r in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ds_straight") / "run"
    run_ranks("deepspeed_run_worker.py", [str(run_dir), *RUN, f"steps={STEPS}"], 2, run_dir.parent / "logs")
    return run_dir


def test_the_run_records_the_layout_it_resolved(straight):
    """trainer=deepspeed's auto settings, resolved before the run started (no GPU: ZeRO-3, nothing offloaded);
    what was set by hand is kept."""
    trainer = json.loads((straight / "config.json").read_text())["trainer"]
    assert (trainer["zero_stage"], trainer["offload_optimizer"], trainer["offload_params"]) == (3, "none", "none")
    assert trainer["micro_batch_tokens"] == 48


def test_a_killed_two_rank_run_resumes_exactly(straight, tmp_path):
    killed = tmp_path / "run"
    args = [str(killed), *RUN, f"steps={STEPS}"]
    procs = start_ranks("deepspeed_run_worker.py", args, 2, tmp_path / "logs_killed")
    deadline = time.monotonic() + 300
    while len(read_jsonl(killed / "metrics.jsonl")) < 1 and all(p.poll() is None for p in procs) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in procs:  # hard, with no chance to clean up
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert len(read_jsonl(killed / "metrics.jsonl")) < STEPS, "the run finished before it could be killed"
    run_ranks("deepspeed_run_worker.py", args, 2, tmp_path / "logs_resumed")

    ref_turns, got_turns = read_jsonl(straight / "turns.jsonl"), read_jsonl(killed / "turns.jsonl")
    assert len(got_turns) == len(ref_turns) == STEPS * 2 * 3 * 2  # steps x tasks x trajectories x turns
    assert _comparable(got_turns) == _comparable(ref_turns)
    ref_metrics, got_metrics = read_jsonl(straight / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert _comparable(got_metrics) == _comparable(ref_metrics)
    assert [m["world_size"] for m in got_metrics] == [2] * STEPS
    assert all(m["gpu_mem_peak_gb"] == 0.0 and m["mfu"] is None and m["host_rss_peak_gb"] > 0 for m in got_metrics)
    assert all(m["train_tokens"] > 0 and m["train_tokens_per_s"] > 0 for m in got_metrics)
    # each rank's own split of the step beside the max over ranks
    for m in got_metrics:
        assert [r["rank"] for r in m["ranks"]] == [0, 1]
        for key in ("generate_s", "evaluate_s", "train_s"):
            assert max(r[key] for r in m["ranks"]) == pytest.approx(m[key], abs=1e-3)
        assert all(0 <= r["barrier_s"] <= m["step_s"] and r["host_rss_peak_gb"] > 0 for r in m["ranks"])
    # the DeepSpeed config the run used, generated from trainer.*
    used = json.loads((killed / "deepspeed_config.json").read_text())
    assert used["zero_optimization"]["stage"] == 3 and used["train_batch_size"] == 2
    # both ranks' task shares are in the records, each once
    tasks = {(r["step"], r["task_id"]) for r in got_turns}
    assert len(tasks) == STEPS * 2


def test_a_two_rank_run_continues_as_one_rank_and_then_as_two(straight, tmp_path):
    """2 ranks -> 1 -> 2: each change of the rank count converts the newest checkpoint to DeepSpeed's universal
    form once (kept beside it) and resumes from it; the rows of the steps before stay as they were."""
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir)
    run_ranks("deepspeed_run_worker.py", [str(run_dir), *RUN, f"steps={STEPS + 1}", "trainer.keep_checkpoints=2"], 1,
              tmp_path / "logs")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 2))
    assert [m["world_size"] for m in metrics] == [2] * STEPS + [1]
    assert _comparable(metrics[:STEPS]) == _comparable(read_jsonl(straight / "metrics.jsonl"))
    assert (run_dir / "checkpoints" / f"step_{STEPS:06d}" / "universal").is_dir()
    said = (tmp_path / "logs" / "rank0.log").read_text()
    assert "to DeepSpeed's universal form" in said and "Extracting ZeRO fragments" in said and "made in" in said

    run_ranks("deepspeed_run_worker.py", [str(run_dir), *RUN, f"steps={STEPS + 2}", "trainer.keep_checkpoints=2"], 2,
              tmp_path / "logs_two")
    again = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["world_size"] for m in again] == [2] * STEPS + [1, 2]
    assert again[:STEPS + 1] == metrics
    assert (run_dir / "checkpoints" / f"step_{STEPS + 1:06d}" / "universal").is_dir()
    # the step made on one rank has a one-rank checkpoint, the newest is the two ranks'; its consolidated weights
    # load as any policy checkpoint's
    one_rank = run_dir / "checkpoints" / f"step_{STEPS + 1:06d}"
    assert json.loads((one_rank / "state.json").read_text())["world_size"] == 1
    last = find_checkpoint(run_dir)
    assert last.name == f"step_{STEPS + 2:06d}" and json.loads((last / "state.json").read_text())["world_size"] == 2
    assert (last / POLICY_FILE).is_file()
    from kevin_exp.config import ModelConfig
    from kevin_exp.models import load_policy

    load_policy_weights(last, load_policy(ModelConfig(name="tiny", source="tiny")).model, "tiny")
