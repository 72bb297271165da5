"""Every record carries the value a run actually used: a headline setting (gamma, normalization), the one
name the math reads too, reaches config.json, turns.jsonl, metrics.jsonl, the ledger and the W&B run's config."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.records.run_records import read_jsonl

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "n_trajectories=2",
         "n_turns=2", "tasks_per_step=1", "rollout.max_new_tokens=4", "steps=1"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path / "home")  # no W&B key: the run is logged offline, in the run folder
    return env


def _wandb_log(run_dir: Path) -> bytes:
    [folder] = (run_dir / "wandb").glob("offline-run-*")
    return b"".join(p.read_bytes() for p in folder.glob("*.wandb"))


@pytest.mark.parametrize("override, knob, value, logged", [
    ("gamma=0.9", "gamma", 0.9, rb'gamma\W{1,6}0\.9'),
    ("normalization=token", "normalization", "token", rb'normalization\W{1,6}token'),
])
def test_a_headline_setting_is_the_value_every_record_carries(tmp_path, override, knob, value, logged):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", *SMALL, override, "logger=wandb",
                           f"hydra.run.dir={run_dir}"], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config[knob] == value and knob not in config["algorithm"]
    assert {r[knob] for r in read_jsonl(run_dir / "turns.jsonl")} == {value}
    assert {r[knob] for r in read_jsonl(run_dir / "metrics.jsonl")} == {value}
    assert re.search(logged, _wandb_log(run_dir))  # the key and its value, as W&B was given them
    if knob == "gamma":  # the returns were computed with it: R_1 = r_1 + gamma * r_2
        rows = {(r["trajectory"], r["turn"]): r for r in read_jsonl(run_dir / "turns.jsonl")}
        assert rows[(0, 1)]["return"] == pytest.approx(rows[(0, 1)]["score"] + value * rows[(0, 2)]["score"])


def test_a_sweep_over_a_headline_setting_is_recorded_in_the_ledger_and_the_rows(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "-m", *SMALL, "gamma=0.0,1.0",
                           f"hydra.sweep.dir={tmp_path}/sweep", f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [entry] = read_jsonl(tmp_path / "ledger.jsonl")
    assert entry["swept"] == {"gamma": ["0.0", "1.0"]}
    gammas = {r["gamma"] for p in (tmp_path / "sweep").glob("*/turns.jsonl") for r in read_jsonl(p)}
    assert gammas == {0.0, 1.0}
