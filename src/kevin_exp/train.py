"""`python -m kevin_exp.train`: one training run of Kevin's recipe, or a sweep with `-m`.

    python -m kevin_exp.train                               # the embedded default (SmolLM2, built-in tasks)
    python -m kevin_exp.train -m gamma=0.0,0.4,1.0          # three runs, Hydra's local launcher
    python -m kevin_exp.train experiment=cpu_smoke          # tiny model, cpu backend
"""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from kevin_exp.config import TrainConfig, register_configs, to_typed
from kevin_exp.hydra_resolvers import register_resolvers
from kevin_exp.models.loading import ModelConfigError
from kevin_exp.resources import ResourceError, check_resources, uses_gpu
from kevin_exp.summary import print_summary
from kevin_exp.trainer.loop import RunDirInUse, TrainingRun
from kevin_exp.trainer.setup import TaskPoolError

register_configs()
register_resolvers()


def sweep_group(cfg: TrainConfig) -> str | None:
    """A sweep's name (its runs share a W&B group): sweep_name, or the sweep directory's name."""
    hc = HydraConfig.get()
    if cfg.sweep_name or hc.mode != RunMode.MULTIRUN:
        return cfg.sweep_name
    return Path(hc.sweep.dir).name


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    typed = to_typed(cfg)
    try:
        if uses_gpu(typed):
            check_resources(typed)  # before anything is written
        run = TrainingRun(typed, config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
                          resolved=OmegaConf.to_container(cfg, resolve=True), sweep=sweep_group(typed))
        run.setup()
    except (ResourceError, RunDirInUse, TaskPoolError, ModelConfigError) as e:
        raise SystemExit(f"error: {e}") from None  # a bad setting: its message names the key and the fix
    run.fit()
    return print_summary(run.run_dir)


if __name__ == "__main__":
    main()
