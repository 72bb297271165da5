"""Shared test helpers: composing the real configs, and a scripted policy for evaluator-backed steps."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from kevin_exp.config import TrainConfig, register_configs, to_typed
from kevin_exp.config.resolvers import register_resolvers
from kevin_exp.rollout.scripted import ScriptedGenerator  # noqa: F401  (tests import it from here)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


# for steps whose records, ranks or scheduling are the point, not the kernels' speed
FEW_TRIALS = ["evaluator.timed_trials=5", "evaluator.warmup_trials=1", "evaluator.correctness_trials=1"]


def compose_train(overrides: list[str], run_dir: Path | None = None) -> TrainConfig:
    """The typed config `python -m kevin_exp.train <overrides>` would run with."""
    register_configs()
    register_resolvers()
    extra = [f"run_dir={run_dir}"] if run_dir is not None else ["run_dir=unused"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        return to_typed(compose(config_name="train", overrides=[*overrides, *extra]))
