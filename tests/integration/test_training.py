"""The training loop end to end on CPU: learning, records, the real evaluator, resume after a kill."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevin_exp.records.rows import MEASURED_COLUMNS
from kevin_exp.records.run_records import TURN_FIELDS, read_jsonl
from kevin_exp.run.training import TrainingRun
from tests.helpers import FEW_TRIALS, ScriptedGenerator, compose_train

REPO = Path(__file__).resolve().parents[2]
TIMING_KEYS = set(MEASURED_COLUMNS)

SYNTHETIC = ["model=tiny", "rollout.env=synthetic", "logger.progress=none"]


def _run(overrides: list[str], run_dir: Path) -> TrainingRun:
    run = TrainingRun(compose_train(overrides, run_dir))
    run.setup()
    return run


def test_tiny_model_learns_the_synthetic_reward(tmp_path):
    """experiment=learn_synthetic, the README's example of the update learning on a CPU, as it stands."""
    run = _run(["experiment=learn_synthetic", "logger.progress=none"], tmp_path)
    history = run.fit()
    assert len(history) == 24
    rewards = [m["reward_mean"] for m in history]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    # a random policy scores about 1/8 (the target is 1/8 of the vocabulary)
    assert first < 0.3
    assert last > first + 0.4, rewards


def test_one_step_with_the_real_cpu_evaluator_and_tiny_model_writes_both_records(tmp_path):
    """The main entry point as a user runs it: a subprocess, the composed config, real compiles (if any)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kevin_exp.train", "experiment=cpu_smoke", "steps=1", f"hydra.run.dir={out}",
         "logger.progress=lines"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"records: {out}" in proc.stdout
    turns = read_jsonl(out / "turns.jsonl")
    metrics = read_jsonl(out / "metrics.jsonl")
    assert len(turns) == 2 * 2 * 2  # tasks x trajectories x turns (cpu_smoke)
    for row in turns:
        assert set(TURN_FIELDS) <= row.keys()
        assert row["split"] == "train" and row["backend"] == "cpu" and row["model"] == "tiny"
        assert row["turn"] in (1, 2) and row["step"] == 1
    # cpu_smoke's scripted responses reach the evaluator: the built-in solution compiles and is correct, the
    # broken one fails to build
    assert {r["status"] for r in turns} == {"ok", "compile_error"}
    assert {r["trajectory"] for r in turns if r["correct"]} == {0}
    assert len(metrics) == 1 and metrics[0]["status_counts"] == {"ok": 4, "compile_error": 4}
    assert (out / "config.yaml").is_file() and json.loads((out / "meta.json").read_text())["git"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert "mean reward" in proc.stdout and f"python -m kevin_exp.show {out}" in proc.stdout


def test_a_step_whose_kernels_reach_the_evaluator_scores_and_trains_on_them(tmp_path):
    """Kernels a random model cannot write come from a scripted sampler; everything after it is real. The timing
    checks' thresholds are raised: here the honest kernel's score is asserted, and on a busy 2-core box the noise
    on the parent's clock flagged it now and then (the checks themselves are tested in tests/adversarial)."""
    run = _run(["experiment=cpu_smoke", "n_trajectories=3", "n_turns=2", "tasks_per_step=2", "steps=1",
                "tasks.ids=[builtin/level1/1,builtin/level1/3]", "logger.progress=none",
                "evaluator.hidden_time_suspect_ms=25", "evaluator.recheck_speedup=1e9", *FEW_TRIALS], tmp_path)
    run.generator = ScriptedGenerator(run.policy.tokenizer, run.pool, "cpu", 3)
    before = {k: v.clone() for k, v in run.policy.model.state_dict().items()}
    [metrics] = run.fit()
    assert metrics["step"] == 1
    turns = read_jsonl(tmp_path / "turns.jsonl")
    by_traj = {}
    for r in turns:
        by_traj.setdefault(r["trajectory"], []).append(r)
    for r in by_traj[0]:
        assert r["status"] == "ok" and r["correct"] is True
        assert r["speedup"] > 0 and r["ref_runtime_ms"] > 0
        assert r["score"] == pytest.approx(0.3 + r["speedup"])
    assert {r["status"] for r in by_traj[1]} == {"compile_error"}
    assert {r["status"] for r in by_traj[2]} == {"format_error"}
    for task in {r["task_id"] for r in turns}:
        rows = {(r["trajectory"], r["turn"]): r for r in turns if r["task_id"] == task}
        # gamma 0.4, sum form: R_1 = r_1 + 0.4 r_2
        assert rows[(0, 1)]["return"] == pytest.approx(rows[(0, 1)]["score"] + 0.4 * rows[(0, 2)]["score"])
        assert rows[(0, 1)]["advantage"] > 0 > rows[(2, 1)]["advantage"]
    assert metrics["correct_per_turn"] == [pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert metrics["grad_norm"] > 0
    after = run.policy.model.state_dict()
    assert any(not after[k].equal(before[k]) for k in before)


def test_a_pipelined_step_records_what_a_barrier_step_records(tmp_path):
    """Scripted responses through the real cpu evaluator: the pipeline (each trajectory goes on when its own
    verdict is in) and the barrier (each turn waits for all) write the same rows, up to what is measured (the
    kernels' times, and so scores, returns, advantages, the verdict's reason and the next prompt's length, which
    quote them; and on a busy machine a timing check may flag a correct kernel as suspect)."""
    measured = {"speedup", "runtime_ms", "ref_runtime_ms", "score", "return", "advantage", "run_id", "reason",
                "prompt_tokens", "status", "correct", "suspect", "rule", "excessive_speedup"}
    statuses = {}
    rows = {}
    for schedule in ("barrier", "pipeline"):
        run = _run(["experiment=cpu_smoke", "n_trajectories=3", "steps=1", f"rollout.schedule={schedule}",
                    "tasks.ids=[builtin/level1/1,builtin/level1/3]", "logger.progress=none", *FEW_TRIALS],
                   tmp_path / schedule)
        run.fit()
        written = read_jsonl(tmp_path / schedule / "turns.jsonl")
        rows[schedule] = [{k: v for k, v in r.items() if k not in measured} for r in written]
        statuses[schedule] = [r["status"] if r["status"] in ("compile_error", "format_error") else "ran" for r in written]
    for a, b in zip(rows["pipeline"], rows["barrier"]):
        assert a == b, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert statuses["pipeline"] == statuses["barrier"]
    assert set(statuses["pipeline"]) == {"ran", "compile_error", "format_error"}
    assert len(rows["pipeline"]) == 2 * 3 * 2


def _strip_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def test_a_killed_run_resumes_and_writes_the_same_rows_as_an_uninterrupted_one(tmp_path):
    args = [sys.executable, "-m", "kevin_exp.train", *SYNTHETIC, "steps=5", "n_trajectories=3", "n_turns=2",
            "tasks_per_step=2", "rollout.max_new_tokens=8", "trainer.lr=1e-3"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run([*args, f"hydra.run.dir={straight}"], cwd=REPO, check=True, capture_output=True, timeout=600)

    # kill the second run hard somewhere in step 3 (after 2 metrics rows), with no chance to clean up
    proc = subprocess.Popen([*args, f"hydra.run.dir={killed}"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(read_jsonl(killed / "metrics.jsonl")) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(read_jsonl(killed / "metrics.jsonl")) < 5, "the run finished before it could be killed"
    subprocess.run([*args, f"hydra.run.dir={killed}"], cwd=REPO, check=True, capture_output=True, timeout=600)

    ref_turns, got_turns = read_jsonl(straight / "turns.jsonl"), read_jsonl(killed / "turns.jsonl")
    ref_metrics, got_metrics = read_jsonl(straight / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert len(got_turns) == len(ref_turns) == 5 * 2 * 3 * 2
    # run ids differ (they name the run dir); everything else matches row for row
    drop = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]  # noqa: E731
    assert drop(got_turns) == drop(ref_turns)
    assert drop(_strip_timing(got_metrics)) == drop(_strip_timing(ref_metrics))


def test_resume_never_refuses_a_run_dir_that_holds_records(tmp_path):
    from kevin_exp.run.training import RunDirInUse

    run = _run(SYNTHETIC + ["steps=1", "n_trajectories=2", "n_turns=1", "rollout.max_new_tokens=4"], tmp_path)
    run.fit()
    with pytest.raises(RunDirInUse, match="resume=auto"):
        _run(SYNTHETIC + ["steps=1", "n_trajectories=2", "n_turns=1", "rollout.max_new_tokens=4", "resume=never"], tmp_path)


def test_a_local_multirun_runs_one_job_per_gamma_in_its_own_directory(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kevin_exp.train", "-m", "gamma=0.0,0.4,1.0", *SYNTHETIC, "steps=1",
         "n_trajectories=2", "n_turns=2", "rollout.max_new_tokens=4", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for gamma in ("0.0", "0.4", "1.0"):
        job = next(tmp_path.glob(f"gamma-{gamma}+*"))
        rows = read_jsonl(job / "turns.jsonl")
        assert rows and {r["gamma"] for r in rows} == {float(gamma)}
        by_key = {(r["task_id"], r["trajectory"], r["turn"]): r for r in rows}
        for (task, traj, turn), r in by_key.items():
            if turn == 1:
                expected = r["score"] + float(gamma) * by_key[(task, traj, 2)]["score"]
                assert r["return"] == pytest.approx(expected)


def _sweep(tmp_path: Path, *overrides: str, sizes: tuple[str, ...] = ("n_trajectories=2", "n_turns=1")):
    return subprocess.run(
        [sys.executable, "-m", "kevin_exp.train", "-m", *SYNTHETIC, "steps=1", *sizes, "tasks_per_step=1",
         "rollout.max_new_tokens=4", f"hydra.sweep.dir={tmp_path}/sweep",
         f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )


def test_a_sweep_file_runs_its_points_and_is_written_to_the_ledger(tmp_path):
    from kevin_exp.records.ledger import ledger_entries

    proc = _sweep(tmp_path, "sweep=serial_vs_parallel", sizes=())
    assert proc.returncode == 0, proc.stderr[-3000:]
    for budget, (traj, turns) in {"t16x4": (16, 4), "t32x2": (32, 2), "t64x1": (64, 1)}.items():
        [job] = (tmp_path / "sweep").glob(f"budget-{budget}+*")
        rows = read_jsonl(job / "turns.jsonl")
        assert len(rows) == traj * turns and {r["n_trajectories"] for r in rows} == {traj}
        assert "sweep=" not in job.name  # the sweep's name is the parent directory, not part of the job's
    [entry] = ledger_entries(tmp_path / "ledger.jsonl", "serial_vs_parallel")
    assert entry["sweep_dir"] == str((tmp_path / "sweep").resolve())
    assert "sweep=serial_vs_parallel" in entry["command"] and entry["git"]["commit"]
    assert entry["params"] == {"budget": "t16x4,t32x2,t64x1"}
    assert entry["swept"] == {"budget": ["t16x4", "t32x2", "t64x1"]}
    assert f"python analysis/ablation_table.py {tmp_path}/sweep" in proc.stdout
    assert proc.stdout.count("job #") == 3


def test_a_named_sweep_refuses_a_directory_holding_another_sweeps_results(tmp_path):
    first = _sweep(tmp_path, "sweep_name=ablation", "gamma=0.0,1.0")
    assert first.returncode == 0, first.stderr[-3000:]
    again = _sweep(tmp_path, "sweep_name=ablation", "gamma=0.0,1.0", "logger.progress=lines")
    assert again.returncode == 0, again.stderr[-3000:]  # the same sweep relaunched continues
    other = _sweep(tmp_path, "sweep_name=ablation", "normalization=token,sequence")
    assert other.returncode != 0
    assert "holds the results of another sweep" in other.stderr and "sweep_name=<new name>" in other.stderr
    assert not list((tmp_path / "sweep").glob("normalization-*"))


def test_state_every_and_a_row_lost_after_its_checkpoint_comes_back(tmp_path):
    """trainer.state_every=2: step 1's checkpoint holds the policy only, steps 2 and 3 (the last) the optimizer's
    states too; every row says what its checkpoint cost. A run stopped after step 3's checkpoint was in place and
    before its row was appended gets the row back from the checkpoint when it starts again."""
    from kevin_exp.trainer.checkpoint import has_full_state

    overrides = SYNTHETIC + ["steps=3", "n_trajectories=2", "n_turns=1", "rollout.max_new_tokens=4",
                             "trainer.state_every=2", "trainer.keep_checkpoints=3"]
    _run(overrides, tmp_path).fit()
    root = tmp_path / "checkpoints"
    assert [has_full_state(root / f"step_{k:06d}") for k in (1, 2, 3)] == [False, True, True]
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["checkpoint_s"] > 0 for r in rows)

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    again = _run(overrides, tmp_path)
    again.folder.close()
    assert again.start_step == 4
    restored = read_jsonl(tmp_path / "metrics.jsonl")
    assert restored[:2] == rows[:2]
    assert restored[2] == {**rows[2], "checkpoint_s": None}
