"""python -m kevin_exp.evaluate: a trained policy on held-out tasks, no training, rows with split=eval; a
restarted evaluation keeps finished batches and writes the same rows as an uninterrupted one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin_exp.evaluation import CheckpointError, EvaluationRun
from kevin_exp.records import read_jsonl
from tests.helpers import compose_train

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model=tiny", "rollout.env=synthetic", "rollout.overlap=false", "logger.progress=none", "rollout.max_new_tokens=4"]
IDS = "tasks.ids=[builtin/level1/1,builtin/level1/2,builtin/level1/3,builtin/level2/1,builtin/level2/2]"
EVAL = [*SMALL, IDS, "eval.n_trajectories=3", "eval.n_turns=2", "eval.tasks_per_batch=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained")
    subprocess.run([sys.executable, "-m", "kevin_exp.train", *SMALL, "steps=2", "n_trajectories=2", "n_turns=1",
                    "trainer.lr=1e-2", f"hydra.run.dir={run_dir}"], cwd=REPO, check=True, capture_output=True, timeout=600)
    return run_dir


def _strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "run_id"} for r in rows]


def test_evaluate_writes_eval_rows_for_every_task_with_the_checkpoints_weights(trained, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.evaluate", *EVAL, f"checkpoint={trained}",
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(tmp_path / "turns.jsonl")
    assert len(rows) == 5 * 3 * 2 and {r["split"] for r in rows} == {"eval"}
    assert {r["step"] for r in rows} == {2}  # the policy after 2 training steps
    assert {(r["n_trajectories"], r["n_turns"]) for r in rows} == {(3, 2)}
    assert {r["turn"] for r in rows} == {1, 2} and {r["trajectory"] for r in rows} == {0, 1, 2}
    assert "correctness best@3" in proc.stdout
    assert not (tmp_path / "metrics.jsonl").read_text()  # no training happened

    run = EvaluationRun(compose_train([*EVAL, f"checkpoint={trained}"], tmp_path / "again"), config_yaml="")
    run.setup()
    saved = torch.load(next((trained / "checkpoints").glob("step_*")).parent / (trained / "checkpoints" / "latest").read_text().strip() / "policy.pt")
    assert all(torch.equal(v, saved[k]) for k, v in run.policy.model.state_dict().items())
    run.env.close()


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


def test_a_missing_checkpoint_or_one_of_another_model_is_a_clear_error(trained, tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint=.*nowhere.*run directory"):
        EvaluationRun(compose_train([*EVAL, f"checkpoint={tmp_path}/nowhere"], tmp_path / "a")).setup()
    run = EvaluationRun(compose_train([*EVAL, "model.tiny_hidden=32", f"checkpoint={trained}"], tmp_path / "b"))
    with pytest.raises(CheckpointError, match="do not fit model=tiny"):
        run.setup()
    run.env.close()
