"""logger=wandb: offline without an API key, one W&B run per run directory (a restarted job continues it),
grouped by sweep and tagged with experiment, sweep and commit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "n_trajectories=2",
         "n_turns=1", "tasks_per_step=1", "rollout.max_new_tokens=4", "logger=wandb"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path / "home")  # no ~/.netrc: no API key anywhere
    return env


def test_wandb_runs_offline_and_a_restarted_run_continues_the_same_wandb_run(tmp_path):
    run_dir = tmp_path / "run"
    for steps in (1, 2):  # the second launch resumes the run (as a requeued SLURM job does)
        proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", *SMALL, f"steps={steps}", "sweep_name=abl",
                               f"hydra.run.dir={run_dir}"], cwd=REPO, env=_env(tmp_path), capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    settings = json.loads((run_dir / "wandb_run.json").read_text())
    run_id = json.loads((run_dir / "meta.json").read_text())["run_id"]
    assert settings["mode"] == "offline" and settings["id"] == run_id and settings["group"] == "abl"
    assert "sweep:abl" in settings["tags"] and any(t.startswith("commit:") for t in settings["tags"])
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(p.name.endswith(f"-{run_id}") for p in offline)
    # each offline log holds the run's id and group, ready for `wandb sync`
    for folder in offline:
        data = (folder / f"run-{run_id}.wandb").read_bytes()
        assert run_id.encode() in data and b"abl" in data


def test_an_unnamed_sweep_groups_its_runs_by_the_sweep_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "-m", *SMALL, "steps=1", "gamma=0.0,1.0",
                           f"hydra.sweep.dir={tmp_path}/my_sweep", f"hydra.callbacks.ledger.path={tmp_path}/l.jsonl"],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "my_sweep").glob("*/wandb_run.json")]
    assert len(runs) == 2 and {r["group"] for r in runs} == {"my_sweep"} and len({r["id"] for r in runs}) == 2
