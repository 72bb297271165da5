"""`python -m kevin_exp.evaluate`: a policy on a held-out split, no training; per-turn rows with split=eval.

    python -m kevin_exp.evaluate                                        # the default model on the built-in suite
    python -m kevin_exp.evaluate checkpoint=outputs/runs/<run> eval.n_trajectories=16 eval.n_turns=8
    python -m kevin_exp.evaluate tasks=kernelbench tasks.kernelbench_path=... experiment=kevin_32b  # the 20 held out
    python -m kevin_exp.evaluate -m checkpoint=<a>,<b> cluster=local_slurm                          # through SLURM
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from kevin_exp.config import register_configs, to_typed
from kevin_exp.evaluation import CheckpointError, EvaluationRun, eval_summary_lines
from kevin_exp.hydra_resolvers import register_resolvers
from kevin_exp.models.loading import ModelConfigError
from kevin_exp.resources import ResourceError, check_resources, uses_gpu
from kevin_exp.train import sweep_group
from kevin_exp.trainer.loop import RunDirInUse
from kevin_exp.trainer.setup import TaskPoolError

register_configs()
register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    typed = to_typed(cfg)
    try:
        if uses_gpu(typed):
            check_resources(typed)
        run = EvaluationRun(typed, config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
                            resolved=OmegaConf.to_container(cfg, resolve=True), sweep=sweep_group(typed))
        run.setup()
    except (ResourceError, RunDirInUse, TaskPoolError, ModelConfigError, CheckpointError) as e:
        raise SystemExit(f"error: {e}") from None
    run.fit()
    print("\n".join(eval_summary_lines(run.run_dir)), flush=True)


if __name__ == "__main__":
    main()
