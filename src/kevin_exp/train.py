"""`python -m kevin_exp.train`: one training run of Kevin's recipe, or a sweep with `-m`.

    python -m kevin_exp.train                               # the embedded default (SmolLM2, built-in tasks)
    python -m kevin_exp.train -m gamma=0.0,0.4,1.0          # three runs, Hydra's local launcher
    python -m kevin_exp.train experiment=cpu_smoke          # tiny model, cpu backend
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from kevin_exp.config import register_configs
from kevin_exp.errors import user_errors
from kevin_exp.hydra_resolvers import register_resolvers
from kevin_exp.job import job_settings
from kevin_exp.preflight import preflight
from kevin_exp.summary import print_summary
from kevin_exp.trainer.loop import TrainingRun

register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
def run(cfg: DictConfig) -> float:
    with user_errors():
        job = job_settings(cfg, entry="train")
        training = TrainingRun(job.cfg, sweep=job.sweep)
        training.setup()
    training.fit()
    return print_summary(training.run_dir, job.cfg)


def main() -> None:
    with user_errors():
        preflight("train", sys.argv[1:])
    run()


if __name__ == "__main__":
    main()
