"""A hub model is checked before anything is made: in the hub cache it passes; neither cached nor reachable, the
launch ends in one error line within seconds, with no run folder (the hub's client would retry for minutes)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.config import ModelConfig
from kevin_exp.models.loading import ModelConfigError, check_model_path

REPO = Path(__file__).resolve().parents[2]
REPO_ID = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"


def test_an_uncached_hub_model_that_cannot_be_reached_is_one_error_line_and_nothing_written(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "model=7b", f"hydra.run.dir={run_dir}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert line.startswith(f"error: model=7b: {REPO_ID} is not in this machine's hub cache and the hub cannot be "
                           "reached") and "point model.path at the folder" in line
    assert not run_dir.exists() and not (tmp_path / "outputs").exists()


def test_a_hub_model_in_the_cache_passes_without_the_hub(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants  # the cache folder is read when the package loads

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    model = ModelConfig(name="7b", source="hf", path=REPO_ID)
    check_model_path(model)
    with pytest.raises(ModelConfigError, match="not in this machine's hub cache"):
        check_model_path(ModelConfig(name="other", source="hf", path="nobody/not-cached"))
