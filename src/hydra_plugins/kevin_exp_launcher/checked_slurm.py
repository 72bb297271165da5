"""submitit's SLURM launcher, with kevin-exp's pre-submission checks (kevin_exp.launch_checks)."""
from __future__ import annotations

from typing import Sequence

from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

from kevin_exp.launch_checks import LaunchError, check_cluster_reachable, check_points, job_config


class CheckedSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        try:
            loader = self.hydra_context.config_loader
            points = [(filter_overrides(o), job_config(loader.load_sweep_config(self.config, list(o))))
                      for o in job_overrides]
            check_points(points, self.params.get("gpus_per_node"))
            check_cluster_reachable(self.config.hydra.runtime.choices.get("cluster", "?"), self.params.get("partition"))
        except LaunchError as e:
            # Hydra reports launcher exceptions as tracebacks; this is a user error with its fix
            raise SystemExit(f"error: {e}") from None
        return super().launch(job_overrides, initial_job_idx)
