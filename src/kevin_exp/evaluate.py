"""`python -m kevin_exp.evaluate`: a policy on a held-out split, no training; per-turn rows with split=eval.

    python -m kevin_exp.evaluate                                        # the default model on the built-in suite
    python -m kevin_exp.evaluate checkpoint=outputs/runs/<run> eval.n_trajectories=16 eval.n_turns=8
    python -m kevin_exp.evaluate tasks=kernelbench tasks.kernelbench_path=... experiment=kevin_32b  # the 20 held out
    python -m kevin_exp.evaluate -m checkpoint=<a>,<b> cluster=local_slurm                          # through SLURM
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from kevin_exp.config import hydra_overrides, register_configs
from kevin_exp.config.resolvers import register_resolvers
from kevin_exp.errors import user_errors
from kevin_exp.launch.job import job_settings, model_chosen
from kevin_exp.launch.preflight import preflight
from kevin_exp.run.evaluation import EvaluationRun, eval_summary_lines
from kevin_exp.run.signals import exits_on_ctrl_c

register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="evaluate")
def run(cfg: DictConfig) -> None:
    with user_errors():
        job = job_settings(cfg, entry="evaluate")
        evaluation = EvaluationRun(job.cfg, sweep=job.sweep, model_chosen=model_chosen(hydra_overrides()))
        evaluation.setup()
    evaluation.fit()
    print("\n".join(eval_summary_lines(evaluation.run_dir)), flush=True)


def main() -> None:
    with exits_on_ctrl_c():  # a Ctrl-C: stop, clean up, say where the records are and how to resume, exit 130
        with user_errors():
            preflight("evaluate", sys.argv[1:])
        run()


if __name__ == "__main__":
    main()
