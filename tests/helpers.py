"""Shared test helpers: composing the real configs, and a scripted policy for evaluator-backed steps."""
from __future__ import annotations

from pathlib import Path

from kevin_exp.config import TrainConfig
from kevin_exp.config.compose import compose_overrides
from kevin_exp.rollout.scripted import ScriptedGenerator  # noqa: F401  (tests import it from here)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


# for steps whose records, ranks or scheduling are the point, not the kernels' speed
FEW_TRIALS = ["evaluator.timed_trials=5", "evaluator.warmup_trials=1", "evaluator.correctness_trials=1"]


def compose_train(overrides: list[str], run_dir: Path | None = None) -> TrainConfig:
    """The typed config `python -m kevin_exp.train <overrides>` would run with."""
    return compose_overrides(overrides, str(run_dir) if run_dir is not None else "unused")
