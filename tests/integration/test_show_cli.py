"""``python -m kevin_exp.show`` as a real subprocess on a run folder written with ``TranscriptWriter``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.records.transcripts import TranscriptWriter, transcript_rows
from tests.unit.test_transcripts import realistic_samples

REPO = Path(__file__).resolve().parents[2]
N_TASKS, N_TRAJECTORIES, N_TURNS = 2, 3, 4


def show(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "kevin_exp.show", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Steps 1 and 2 of a run; returns the folder and step 2's rows."""
    run_dir = tmp_path_factory.mktemp("run")
    samples = realistic_samples(N_TASKS, N_TRAJECTORIES, N_TURNS)
    with TranscriptWriter(run_dir) as writer:
        writer.append(1, transcript_rows("train", 1, samples[:N_TRAJECTORIES * N_TURNS]))
        rows = transcript_rows("train", 2, samples)
        # as a rollout that appends a group of tasks at a time
        writer.append(2, rows[:N_TRAJECTORIES * N_TURNS])
        writer.append(2, rows[N_TRAJECTORIES * N_TURNS:])
    return run_dir, rows


def test_one_trajectory_turn_by_turn(run):
    run_dir, rows = run
    task = rows[-1]["task_id"]
    result = show(str(run_dir), "--task", task, "--trajectory", "1", "--full")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    turns = [r for r in rows if r["task_id"] == task and r["trajectory"] == 1]
    assert [r["turn"] for r in turns] == [1, 2, 3, 4]
    position = 0
    for row in turns:
        header = out.index(f"turn {row['turn']} of {N_TURNS} | {row['status']} |", position)
        assert header >= position
        position = out.index(row["response"], header)
        if row["kernel"] is not None:
            position = out.index(row["kernel"], position + len(row["response"]))
        position = out.index(row["feedback"], position)
    assert "--- kernel ---\n(none: no complete code block was parsed)" in out
    assert "chose" not in out


def test_defaults_to_the_first_trajectory_of_the_first_task_of_the_last_step(run):
    run_dir, rows = run
    result = show(str(run_dir))
    assert result.returncode == 0, result.stderr
    first_line, choice = result.stdout.splitlines()[:2]
    assert f"step 2 (train) | task {rows[0]['task_id']}" in first_line and "trajectory 0 of 0-2" in first_line
    assert choice.startswith(f"(chose task {rows[0]['task_id']} and trajectory 0") and "--list" in choice
    # responses longer than the head and tail are elided in the middle
    assert "lines elided; --full shows them" in result.stdout or "characters elided" in result.stdout
    assert rows[0]["kernel"] in result.stdout


def test_list_shows_every_trajectory_and_turn_status(run):
    run_dir, rows = run
    result = show(str(run_dir), "--step", "1", "--list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "step 1 (train):"
    assert lines[1].split() == ["task", "trajectory", "turn", "1", "turn", "2", "turn", "3", "turn", "4"]
    table = [line.split() for line in lines[2:2 + N_TRAJECTORIES]]
    step_one = [r for r in rows if r["task_id"] == rows[0]["task_id"]]
    for j, cells in enumerate(table):
        assert cells[:2] == [rows[0]["task_id"], str(j)]
        assert [c for c in cells[2:] if not c.endswith("x")] == [r["status"] for r in step_one if r["trajectory"] == j]
    assert "--task ID --trajectory J" in lines[-1]


def test_a_step_with_train_and_eval_rows(tmp_path: Path):
    samples = realistic_samples(n_tasks=1, n_trajectories=1, n_turns=2)
    with TranscriptWriter(tmp_path) as writer:
        writer.append(3, transcript_rows("train", 3, samples))
        writer.append(3, transcript_rows("eval", 3, samples[1:]))
    train = show(str(tmp_path))
    assert train.returncode == 0, train.stderr
    assert "step 3 (train; eval rows too: --split eval)" in train.stdout and "2 turns" in train.stdout
    evaluation = show(str(tmp_path), "--split", "eval", "--list")
    assert evaluation.returncode == 0, evaluation.stderr
    assert evaluation.stdout.startswith("step 3 (eval; train rows too: --split train):")
    assert evaluation.stdout.splitlines()[1].split()[-2:] == ["turn", "2"]


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "does not exist"),
    (["{empty}"], "runs started before transcripts were recorded have none"),
    (["{run}", "--step", "9"], "steps with transcripts: 1-2"),
    (["{run}", "--task", "builtin/level9/99"], "its tasks: builtin/level1/1, builtin/level1/2"),
    (["{run}", "--trajectory", "7"], "has trajectories 0-2"),
    (["{run}", "--split", "eval"], "has no eval rows"),
    (["{run}", "--step", "last"], "invalid int value"),
])
def test_bad_input_is_one_line_and_exit_2(run, tmp_path: Path, args: list[str], message: str):
    run_dir, _ = run
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "run": run_dir}
    result = show(*(a.format(**paths) for a in args))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
