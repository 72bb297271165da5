"""A run of two ranks as one SLURM job of two tasks (submitit's launcher, tasks_per_node from
resources.ranks_per_node): each task runs the Hydra job in the job's folder and joins the run with the rank
SLURM gave it; preempted, the job is requeued and its ranks resume from the last checkpoint.

The local cluster has 2 cores: each task asks for one (cluster=local_slurm)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevin_exp.records.run_records import read_jsonl
from tests.helpers import FEW_TRIALS
from tests.slurm.test_slurm_sweeps import SYNTHETIC, _expected_steps, _run_dirs, _sacct_states, _slurm_job_ids

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
RANK_TRAINER = ["trainer=deepspeed", "trainer.bf16=false", "trainer.offload_optimizer=none",
                "trainer.activation_checkpointing=false", "trainer.dist_timeout_s=120"]
TWO_TASKS = ["cluster=local_slurm", "resources=cpu", "resources.ranks_per_node=2", *RANK_TRAINER]


def _train(*args: str) -> list[str]:
    return [sys.executable, "-m", "kevin_exp.train", *args]


def _ranks_of(start: dict) -> list[int]:
    return [r["rank"] for r in start["ranks"]]


def test_a_two_task_job_is_one_run_of_two_ranks(tmp_path):
    sweep, ledger = tmp_path / "sweep", tmp_path / "ledger.jsonl"
    proc = subprocess.run(
        _train("-m", "gamma=0.4", *TWO_TASKS, "experiment=cpu_smoke", "steps=1", "tasks_per_step=2",
               "rollout.max_new_tokens=16", "logger.progress=lines",
               *FEW_TRIALS, f"hydra.sweep.dir={sweep}",
               f"hydra.callbacks.ledger.path={ledger}"),
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [job] = _run_dirs(sweep)
    assert json.loads((job / "config.json").read_text())["resources"]["ranks_per_node"] == 2
    [start] = json.loads((job / "meta.json").read_text())["starts"]
    assert start["world_size"] == 2 and _ranks_of(start) == [0, 1]
    assert len({r["pid"] for r in start["ranks"]}) == 2
    assert len(read_jsonl(job / "turns.jsonl")) == 2 * 2 * 2 and len(read_jsonl(ledger)) == 1
    [job_id] = _slurm_job_ids(sweep)
    assert _sacct_states(job_id) == ["COMPLETED"]
    # one SLURM job, two tasks: each task logged its own run of the job
    logs = sweep / ".submitit" / job_id
    assert sorted(p.name for p in logs.glob("*_log.out")) == [f"{job_id}_0_log.out", f"{job_id}_1_log.out"]
    # rank 0 alone printed the summary
    assert "records:" in (logs / f"{job_id}_0_log.out").read_text()
    assert "records:" not in (logs / f"{job_id}_1_log.out").read_text()


def test_a_preempted_two_task_job_is_requeued_and_both_ranks_resume(tmp_path):
    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen(
        _train("-m", "gamma=0.4", *TWO_TASKS, *SYNTHETIC, f"hydra.sweep.dir={sweep}",
               f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        metrics = []
        while launcher.poll() is None and time.monotonic() < deadline:
            metrics = [read_jsonl(p) for p in sweep.glob("*/metrics.jsonl")]
            if metrics and len(metrics[0]) >= 2:
                break
            time.sleep(0.1)
        assert metrics and 2 <= len(metrics[0]) < 6, "the job finished (or never started) before it could be signalled"
        [job_id] = _slurm_job_ids(sweep)
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        out, _ = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out[-4000:]
    [job] = _run_dirs(sweep)
    starts = json.loads((job / "meta.json").read_text())["starts"]
    assert [s["slurm_restart_count"] for s in starts] == [0, 1], starts
    # both starts had both ranks, and the second resumed from a checkpoint
    assert [s["world_size"] for s in starts] == [2, 2] and all(_ranks_of(s) == [0, 1] for s in starts)
    assert starts[1]["start_step"] > 1
    assert _sacct_states(job_id) == ["COMPLETED"]
    assert [m["step"] for m in read_jsonl(job / "metrics.jsonl")] == _expected_steps(6)
    turns = read_jsonl(job / "turns.jsonl")
    keys = [(r["step"], r["task_id"], r["trajectory"], r["turn"]) for r in turns]
    assert len(keys) == len(set(keys)) == 6 * 2 * 3 * 2  # every row once: steps x tasks x trajectories x turns
