"""Sweeps through a real SLURM cluster (slurm/local-cluster.sh in CI): one job per point via submitit, and a
job that SLURM signals for preemption is requeued and resumes with every row once.

Skipped where no `sinfo` exists; CI starts the local cluster first.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevin_exp.records.rows import MEASURED_COLUMNS
from kevin_exp.records.run_records import read_jsonl
from tests.helpers import FEW_TRIALS

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TIMING_KEYS = {*MEASURED_COLUMNS, "run_id"}
# what the launcher prints per submitted job (hydra_plugins/kevin_exp_launcher/checked_slurm.py)
JOB_LINE = re.compile(r"job (?P<id>\S+) \[(?P<overrides>.*)\] run: (?P<run>.+) logs: (?P<logs>.+)/")


def _train(*args: str) -> list[str]:
    return [sys.executable, "-m", "kevin_exp.train", *args]


def _expected_steps(n: int) -> list[int]:
    return list(range(1, n + 1))


def _run_dirs(sweep_dir: Path) -> list[Path]:
    """A sweep's job folders, found by their records rather than by name."""
    return sorted(p.parent for p in sweep_dir.glob("*/config.json"))


def _config(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def _slurm_job_ids(sweep_dir: Path) -> list[str]:
    return sorted(p.name for p in (sweep_dir / ".submitit").iterdir() if p.is_dir())


def _sacct_states(job_id: str, settle_s: float = 60.0) -> list[str]:
    """The jobs' states in SLURM's accounting, which records a job's end a little after the job has ended:
    waits (bounded) for states that are still RUNNING or PENDING to settle."""
    deadline = time.monotonic() + settle_s
    while True:
        out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True,
                             text=True, check=True).stdout
        states = [line.split("|")[1] for line in out.splitlines() if line]
        if not {"RUNNING", "PENDING", "COMPLETING"} & set(states) or time.monotonic() > deadline:
            return states
        time.sleep(1)


def _launch_reading_job_lines(cmd: list[str], timeout_s: float) -> tuple[int, str, bool]:
    """Runs a launch to its end; also says whether the launcher was still waiting on its jobs when it printed
    its first job line."""
    launcher = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        head = []
        for line in launcher.stdout:
            head.append(line)
            if JOB_LINE.fullmatch(line.rstrip("\n")):
                break
        waiting = launcher.poll() is None
        rest, _ = launcher.communicate(timeout=timeout_s)
    finally:
        launcher.kill()
    return launcher.returncode, "".join(head) + rest, waiting


def test_a_gamma_sweep_runs_as_three_slurm_jobs_with_their_own_records(tmp_path):
    sweep = tmp_path / "sweep"
    returncode, out, waiting = _launch_reading_job_lines(
        _train("-m", "gamma=0.0,0.4,1.0", "cluster=local_slurm", "resources=cpu", "experiment=cpu_smoke", "steps=2",
               "tasks_per_step=1", "rollout.max_new_tokens=16",
               *FEW_TRIALS, f"hydra.sweep.dir={sweep}",
               f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl"), timeout_s=900)
    assert returncode == 0, out[-4000:]
    assert "Submitit 'slurm' sweep output dir" in out
    seen_jobs = set()
    by_gamma = {_config(job)["gamma"]: job for job in _run_dirs(sweep)}
    assert sorted(by_gamma) == [0.0, 0.4, 1.0]
    for gamma, job in by_gamma.items():
        turns, metrics = read_jsonl(job / "turns.jsonl"), read_jsonl(job / "metrics.jsonl")
        assert [m["step"] for m in metrics] == _expected_steps(2)
        assert len(turns) == 2 * 1 * 2 * 2 and {t["gamma"] for t in turns} == {gamma}
        assert {t["backend"] for t in turns} == {"cpu"}
        [start] = json.loads((job / "meta.json").read_text())["starts"]
        assert start["slurm_job_id"] and start["slurm_array_task_id"] in {"0", "1", "2"}
        seen_jobs.add(start["slurm_job_id"])
    assert len(seen_jobs) == 3  # one SLURM job per point
    [array_job] = {j.split("_")[0] for j in _slurm_job_ids(sweep)}
    assert _sacct_states(array_job) == ["COMPLETED"] * 3

    # the launcher printed a line per job as soon as the array was queued, before waiting on it
    assert waiting
    printed = [m for m in map(JOB_LINE.fullmatch, out.splitlines()) if m]
    # .submitit/<array id>/ holds the array's submission files; each job has its own <array id>_<index>/
    assert sorted(m["id"] for m in printed) == [j for j in _slurm_job_ids(sweep) if "_" in j]
    for m in printed:
        run_dir, [gamma] = Path(m["run"]), [o for o in m["overrides"].split() if o.startswith("gamma=")]
        assert _sacct_states(m["id"]) == ["COMPLETED"]
        assert Path(m["logs"]) == sweep / ".submitit" / m["id"] and any(Path(m["logs"]).glob("*_log.out"))
        assert run_dir == by_gamma[float(gamma.split("=")[1])]
        [start] = json.loads((run_dir / "meta.json").read_text())["starts"]
        assert f"{start['slurm_array_job_id']}_{start['slurm_array_task_id']}" == m["id"]


SYNTHETIC = ["model=tiny", "rollout.env=synthetic", "logger.progress=lines", "steps=6",
             "n_trajectories=3", "n_turns=2", "tasks_per_step=2", "rollout.max_new_tokens=8", "trainer.lr=1e-3"]


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def test_a_preempted_job_checkpoints_is_requeued_and_resumes_with_every_row_once(tmp_path):
    straight = tmp_path / "straight"
    # the job's resources (one core: its thread count, so its floating-point sums run in the same order)
    subprocess.run(_train(*SYNTHETIC, "resources=cpu", f"hydra.run.dir={straight}"), cwd=REPO, check=True, capture_output=True,
                   timeout=600)

    sweep = tmp_path / "sweep"
    launcher = subprocess.Popen(
        _train("-m", "gamma=0.4", "cluster=local_slurm", "resources=cpu", *SYNTHETIC, f"hydra.sweep.dir={sweep}",
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
        # what SLURM sends before a time limit or a preemption (hydra.launcher.signal_delay_s)
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        out, _ = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out[-4000:]

    [job] = _run_dirs(sweep)
    starts = json.loads((job / "meta.json").read_text())["starts"]
    assert [s["slurm_restart_count"] for s in starts] == [0, 1], starts  # requeued once, same SLURM job
    assert starts[0]["slurm_job_id"] == starts[1]["slurm_job_id"] and starts[1]["start_step"] > 1
    log = next((sweep / ".submitit" / job_id).glob("*_log.err")).read_text()
    assert "Caught signal SIGUSR2" in log and ("Requeued job" in log or "requeue" in log.lower())
    assert _strip(read_jsonl(job / "turns.jsonl")) == _strip(read_jsonl(straight / "turns.jsonl"))
    assert _strip(read_jsonl(job / "metrics.jsonl")) == _strip(read_jsonl(straight / "metrics.jsonl"))


def test_an_evaluation_sweep_runs_through_slurm_like_training(tmp_path):
    trained = tmp_path / "trained"
    subprocess.run(_train("model=tiny", "rollout.env=synthetic", "logger.progress=none",
                          "steps=1", "n_trajectories=2", "n_turns=1", "rollout.max_new_tokens=4",
                          f"hydra.run.dir={trained}"), cwd=REPO, check=True, capture_output=True, timeout=600)
    sweep = tmp_path / "evals"
    proc = subprocess.run(
        [sys.executable, "-m", "kevin_exp.evaluate", "-m", "cluster=local_slurm", "resources=cpu", "model=tiny",
         "rollout.env=synthetic", "rollout.max_new_tokens=4", f"checkpoint={trained}",
         "tasks.ids=[builtin/level1/1,builtin/level2/1]", "eval.n_trajectories=2", "eval.n_turns=1,2",
         f"hydra.sweep.dir={sweep}", f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl"],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    by_turns = {_config(j)["eval"]["n_turns"]: j for j in _run_dirs(sweep)}
    assert sorted(by_turns) == [1, 2]
    for turns, job in by_turns.items():
        rows = read_jsonl(job / "turns.jsonl")
        assert len(rows) == 2 * 2 * turns and {r["split"] for r in rows} == {"eval"}
        assert json.loads((job / "meta.json").read_text())["starts"][0]["slurm_job_id"]


def test_a_job_reaching_its_time_limit_is_requeued_and_finishes_with_every_row_once(tmp_path):
    """The real time-limit signal: a 2-minute limit with USR2 55 s before it (SLURM checks limits every ~30 s
    and signals up to one period early, so it lands 35-65 s into each attempt); the job needs several
    attempts and every step is recorded once."""
    sweep = tmp_path / "sweep"
    steps = 200  # ~95 s of steps on a 2-core box: more than one attempt's 35-65 s
    proc = subprocess.run(
        _train("-m", "gamma=0.4", "cluster=local_slurm", "resources=cpu", *SYNTHETIC, f"steps={steps}",
               "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=55", f"hydra.sweep.dir={sweep}",
               f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl"),
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [job] = _run_dirs(sweep)
    starts = json.loads((job / "meta.json").read_text())["starts"]
    assert len(starts) >= 2 and [s["slurm_restart_count"] for s in starts] == list(range(len(starts)))
    assert [s["start_step"] for s in starts] == sorted(s["start_step"] for s in starts)
    turns = read_jsonl(job / "turns.jsonl")
    keys = [(r["step"], r["task_id"], r["trajectory"], r["turn"]) for r in turns]
    assert len(keys) == len(set(keys)) == steps * 2 * 3 * 2
    assert [m["step"] for m in read_jsonl(job / "metrics.jsonl")] == _expected_steps(steps)
    log = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.err"))
    assert "this job is timed-out" in log


def test_a_sweep_relaunched_while_its_job_runs_submits_nothing_and_the_first_launch_goes_on(tmp_path):
    """The second launch names the running job's point, folder and SLURM job, and how to finish the sweep; the
    first launcher keeps waiting and its job writes every row once."""
    sweep = tmp_path / "sweep"
    cmd = _train("-m", "gamma=0.4", "cluster=local_slurm", "resources=cpu", *SYNTHETIC, "steps=12",
                 f"hydra.sweep.dir={sweep}", f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl")
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while first.poll() is None and time.monotonic() < deadline:
            if any(read_jsonl(p) for p in sweep.glob("*/metrics.jsonl")):
                break
            time.sleep(0.2)
        [job_id] = _slurm_job_ids(sweep)
        again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert first.poll() is None, "the first launch ended before the second could meet its running job"
        [run] = _run_dirs(sweep)
        assert again.returncode != 0
        assert "error: nothing was submitted: 1 point(s) of this sweep are still being written by a running job" in again.stderr
        array = job_id.split("_")[0]
        # the point as the job lines name it (its overrides), its folder, and who writes it
        point = re.search(r"^  \[(?P<overrides>.*)\] (?P<run>\S+) \(pid (?P<who>.*)\)$", again.stderr, re.M)
        assert point, again.stderr
        assert point["overrides"].startswith("gamma=0.4 ") and point["run"] == str(run), again.stderr
        assert re.search(rf", SLURM job {array}(_0)?$", point["who"]), again.stderr  # (an array of one is a plain job)
        assert f"squeue -j {array}" in again.stderr and "relaunch the same command once they have ended" in again.stderr
        assert "Traceback" not in again.stderr + again.stdout
        assert _slurm_job_ids(sweep) == [job_id], "the second launch submitted nothing"
        out, _ = first.communicate(timeout=900)
    finally:
        first.kill()
    assert first.returncode == 0, out[-4000:]
    steps = [row["step"] for row in read_jsonl(run / "metrics.jsonl")]
    assert steps == _expected_steps(12)
