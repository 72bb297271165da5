"""`python -m kevin_exp.train`: one training run of Kevin's recipe, or a sweep with `-m`.

    python -m kevin_exp.train                               # the embedded default (SmolLM2, built-in tasks)
    python -m kevin_exp.train -m gamma=0.0,0.4,1.0          # three runs, Hydra's local launcher
    python -m kevin_exp.train experiment=cpu_smoke          # tiny model, cpu backend
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from kevin_exp.config import register_configs, to_typed
from kevin_exp.hydra_resolvers import register_resolvers
from kevin_exp.summary import print_summary
from kevin_exp.trainer.loop import TrainingRun

register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    run = TrainingRun(to_typed(cfg), config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
                      resolved=OmegaConf.to_container(cfg, resolve=True))
    run.setup()
    run.fit()
    return print_summary(run.run_dir)


if __name__ == "__main__":
    main()
