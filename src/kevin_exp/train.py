"""`python -m kevin_exp.train`: one training run of Kevin's recipe, or a sweep with `-m`.

    python -m kevin_exp.train                               # the embedded default (SmolLM2, built-in tasks)
    python -m kevin_exp.train -m gamma=0.0,0.4,1.0          # three runs, Hydra's local launcher
    python -m kevin_exp.train experiment=cpu_smoke          # tiny model, cpu backend
    python -m kevin_exp.train experiment=kevin_32b resources=h200x8   # 8 ranks, one per GPU (kevin_exp/launch/ranks.py)
    torchrun --nproc_per_node 8 -m kevin_exp.train ...      # the same ranks, started by torchrun
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from kevin_exp.config import hydra_overrides, register_configs
from kevin_exp.config.resolvers import register_resolvers
from kevin_exp.errors import user_errors
from kevin_exp.launch import ranks
from kevin_exp.launch.job import job_settings
from kevin_exp.launch.preflight import launched_by_cluster, preflight
from kevin_exp.records.summary import print_summary
from kevin_exp.run.signals import exits_on_ctrl_c
from kevin_exp.run.training import TrainingRun

register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
def run(cfg: DictConfig) -> float:
    with user_errors():
        job = job_settings(cfg, entry="train")
        if ranks.wants_local_spawn(job.cfg, cluster_launch=launched_by_cluster()):
            # this job only starts the run's ranks on this machine and waits: each is this same job
            ranks.spawn_local_ranks(job.cfg, hydra_overrides(), job.cfg.run_dir)
            return ranks.final_reward(job.cfg.run_dir)
        ranks.join_run(job.cfg)
    try:
        with user_errors():
            training = TrainingRun(job.cfg, sweep=job.sweep)
            training.setup()
        training.fit()
    finally:
        ranks.leave_run()
    return print_summary(training.run_dir, job.cfg)


def main() -> None:
    with exits_on_ctrl_c():  # a Ctrl-C: stop, clean up, say where the records are and how to resume, exit 130
        with user_errors():
            preflight("train", sys.argv[1:])
        run()


if __name__ == "__main__":
    main()
