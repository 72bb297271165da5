"""cluster=<SLURM profile> launches stop before anything is submitted when a point cannot fit its GPUs or
when no cluster answers, with one message that names the numbers or the key and the fix."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _launch(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kevin_exp.train", "-m", "cluster=local_slurm", *overrides,
         f"hydra.sweep.dir={tmp_path}/sweep", f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


def test_a_32b_sweep_on_too_few_gpus_stops_before_submission_with_the_numbers(tmp_path):
    proc = _launch(tmp_path, "experiment=kevin_32b", "tasks=builtin", "resources=gpu1", "gamma=0.4,1.0")
    assert proc.returncode == 2
    assert "nothing was submitted" in proc.stderr and proc.stderr.count("does not fit the requested GPUs") == 2
    assert "gamma=0.4" in proc.stderr and "GB per GPU" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "sweep" / ".submitit").exists()


def test_points_asking_for_different_resources_are_refused(tmp_path):
    proc = _launch(tmp_path, "experiment=cpu_smoke", "resources=cpu,gpu1")
    assert proc.returncode != 0 and "launch each resources= choice as its own sweep" in proc.stderr


def test_no_slurm_client_is_a_clear_error(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    proc = _launch(tmp_path, "experiment=cpu_smoke", "resources=cpu", env=env)
    assert proc.returncode != 0
    assert "no SLURM client" in proc.stderr and "slurm/local-cluster.sh start" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(shutil.which("sinfo") is None, reason="no SLURM client here")
def test_an_unreachable_controller_is_a_clear_error(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=1\n"
                    "NodeName=x CPUs=1\nPartitionName=p Nodes=x\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    proc = _launch(tmp_path, "experiment=cpu_smoke", "resources=cpu", env=env)
    assert proc.returncode != 0
    assert "SLURM controller is unreachable" in proc.stderr and "SLURM_CONF" in proc.stderr


@pytest.mark.slurm
def test_an_unknown_partition_is_named_with_the_ones_that_exist(tmp_path):
    proc = _launch(tmp_path, "experiment=cpu_smoke", "resources=cpu", "hydra.launcher.partition=h100x")
    assert proc.returncode != 0
    assert "hydra.launcher.partition='h100x'" in proc.stderr and "debug" in proc.stderr


def test_a_missing_model_path_stops_a_cluster_launch_and_a_local_run(tmp_path):
    proc = _launch(tmp_path, "model=7b", f"model.path={tmp_path}/no_such_model", "resources=h200x8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"model.path='{tmp_path}/no_such_model' is not an existing folder" in proc.stderr
    assert not (tmp_path / "sweep").exists()  # nothing submitted, no sweep folder
    local = subprocess.run([sys.executable, "-m", "kevin_exp.train", "model=7b", f"model.path={tmp_path}/no_such_model",
                            "resources.check=false", "trainer.device=cpu", f"hydra.run.dir={tmp_path}/run"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert local.returncode != 0 and "error: model.path=" in local.stderr and "Traceback" not in local.stderr
