"""python -m kevin_exp.evaluate: a trained policy on held-out tasks, no training, rows with split=eval; a
restarted evaluation keeps finished batches and writes the same rows as an uninterrupted one."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin_exp.models import load_policy
from kevin_exp.records.run_records import read_jsonl
from kevin_exp.records.transcripts import read_transcripts
from kevin_exp.run.evaluation import CheckpointError, EvaluationRun
from kevin_exp.trainer.checkpoint import load_policy_weights
from tests.helpers import compose_train

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "rollout.max_new_tokens=4"]
IDS = "tasks.ids=[builtin/level1/1,builtin/level1/2,builtin/level1/3,builtin/level2/1,builtin/level2/2]"
EVAL = [*SMALL, IDS, "eval.n_trajectories=3", "eval.n_turns=2", "eval.tasks_per_batch=2"]


@pytest.fixture(scope="module")
def trained_proc(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A training run in its default folder (outputs/runs/<overrides>), as a user starts it."""
    cwd = tmp_path_factory.mktemp("project")
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", *SMALL, "steps=2", "n_trajectories=2", "n_turns=1",
                           "gamma=1.0", "trainer.lr=1e-2"], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [run_dir] = (cwd / "outputs" / "runs").iterdir()
    return run_dir, proc


@pytest.fixture(scope="module")
def trained(trained_proc) -> Path:
    return trained_proc[0]


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "run_id"} for r in rows]


def test_evaluate_writes_eval_rows_for_every_task_with_the_checkpoints_weights(trained, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.evaluate", *EVAL, f"checkpoint={trained}",
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(tmp_path / "turns.jsonl")
    assert len(rows) == 5 * 3 * 2 and {r["split"] for r in rows} == {"eval"}
    assert {r["step"] for r in rows} == {2}  # the policy after 2 training steps
    # the checkpoint's training settings, and the evaluation's own budget apart from them
    assert {(r["gamma"], r["n_trajectories"], r["n_turns"], r["model"]) for r in rows} == {(1.0, 2, 1, "tiny")}
    assert {(r["eval_n_trajectories"], r["eval_n_turns"]) for r in rows} == {(3, 2)}
    assert {r["turn"] for r in rows} == {1, 2} and {r["trajectory"] for r in rows} == {0, 1, 2}
    assert "correctness best@3" in proc.stdout
    assert not (tmp_path / "metrics.jsonl").read_text()  # no training happened

    run = EvaluationRun(compose_train([*EVAL, f"checkpoint={trained}"], tmp_path / "again"))
    run.setup()
    reference = load_policy(run.cfg.model).model
    latest = trained / "checkpoints" / (trained / "checkpoints" / "latest").read_text().strip()
    load_policy_weights(latest, reference)
    assert all(torch.equal(v, reference.state_dict()[k]) for k, v in run.policy.model.state_dict().items())
    run.env.close()


def test_the_printed_evaluate_command_runs_as_pasted_with_the_checkpoints_model(trained_proc, tmp_path):
    run_dir, proc = trained_proc
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("evaluate it: ")]
    command = shlex.split(line.removeprefix("evaluate it: "))
    assert command[:3] == ["python", "-m", "kevin_exp.evaluate"]
    assert "=" not in run_dir.name and "," not in run_dir.name  # nothing Hydra would read as override syntax
    # no model= given: the evaluation uses the checkpoint's (tiny), not the default model
    done = subprocess.run([sys.executable, *command[1:], *EVAL[1:], f"hydra.run.dir={tmp_path}"], cwd=run_dir.parents[2],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {r["model"] for r in read_jsonl(tmp_path / "turns.jsonl")} == {"tiny"}
    other = subprocess.run([sys.executable, *command[1:], "model=smollm2_135m", f"hydra.run.dir={tmp_path}/other"],
                           cwd=run_dir.parents[2], capture_output=True, text=True, timeout=600)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert other.stderr.strip().splitlines()[-1].startswith("error: checkpoint=") and "model=tiny" in other.stderr


def test_a_restarted_evaluation_keeps_finished_batches_and_matches_an_uninterrupted_one(trained, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for d in (straight,):
        run = EvaluationRun(compose_train([*EVAL, f"checkpoint={trained}"], d))
        run.setup()
        run.fit()
    ref = read_jsonl(straight / "turns.jsonl")
    # as if killed in the middle of the second batch: batch 1 whole, half of batch 2's rows
    first_two = {"builtin/level1/1", "builtin/level1/2"}
    kept = [r for r in ref if r["task_id"] in first_two] + [r for r in ref if r["task_id"] == "builtin/level1/3"][:4]
    resumed.mkdir()
    (resumed / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    run = EvaluationRun(compose_train([*EVAL, f"checkpoint={trained}"], resumed))
    run.setup()
    assert run.done_tasks == first_two
    summaries = run.fit()
    assert [s["tasks"] for s in summaries] == [["builtin/level1/3", "builtin/level2/1"], ["builtin/level2/2"]]
    got = read_jsonl(resumed / "turns.jsonl")
    key = lambda r: (r["task_id"], r["trajectory"], r["turn"])  # noqa: E731
    assert _strip(sorted(got, key=key)) == _strip(sorted(ref, key=key))
    # transcripts of the batches that ran here, each turn once (the uninterrupted run has all of them)
    assert sorted(map(key, read_transcripts(resumed))) == sorted(key(r) for r in ref if r["task_id"] not in first_two)
    assert sorted(map(key, read_transcripts(straight))) == sorted(map(key, ref))


def test_a_missing_checkpoint_or_one_of_another_model_is_a_clear_error(trained, tmp_path):
    from kevin_exp.errors import UserError

    with pytest.raises(UserError, match="checkpoint=.*nowhere"):
        EvaluationRun(compose_train([*EVAL, f"checkpoint={tmp_path}/nowhere"], tmp_path / "a")).setup()
    with pytest.raises(CheckpointError, match="was trained with model=tiny"):
        EvaluationRun(compose_train([*EVAL, "model.tiny_hidden=32", f"checkpoint={trained}"], tmp_path / "b"),
                      model_chosen=True)
