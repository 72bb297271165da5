"""Checks made before a sweep is submitted to SLURM: the cluster answers, and every point's model fits the
GPUs it asks for. A bad launch stops on the login node, with the numbers and the fix, instead of failing in
the queue hours later."""
from __future__ import annotations

import shutil
import subprocess
from typing import Any, Sequence

from omegaconf import DictConfig, open_dict

from kevin_exp.config import TrainConfig, to_typed
from kevin_exp.errors import LaunchError
from kevin_exp.launch.layout import resolve_layout
from kevin_exp.launch.memory_check import ResourceError, check_resources
from kevin_exp.models.loading import ModelConfigError, check_model_path


def check_cluster_reachable(profile: str, partition: str | None, timeout_s: float = 20.0) -> None:
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        raise LaunchError(
            f"cluster={profile}: this machine has no SLURM client (sinfo not found). Launch from the cluster's "
            "login node, start the local cluster with `bash slurm/local-cluster.sh start` (cluster=local_slurm), "
            "or leave cluster= out to run the sweep here.")
    try:
        proc = subprocess.run([sinfo, "--noheader", "--format=%R %a"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess([sinfo], 1, "", f"no answer within {timeout_s:.0f} s")
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise LaunchError(
            f"cluster={profile}: the SLURM controller is unreachable (sinfo: {said[-1] if said else 'failed'}). "
            "Start it (`bash slurm/local-cluster.sh start` for cluster=local_slurm), check SLURM_CONF, or leave "
            "cluster= out to run the sweep here.")
    partitions = {line.split()[0] for line in proc.stdout.splitlines() if line.split()}
    if partition and partition not in partitions:
        raise LaunchError(
            f"hydra.launcher.partition={partition!r} is not a partition of this cluster (it has: "
            f"{', '.join(sorted(partitions)) or 'none'}): set it in the cluster profile or on the command line.")


def job_config(sweep_config: DictConfig) -> TrainConfig:
    """A sweep point's typed config, outside of a running job (no Hydra runtime to resolve run_dir)."""
    cfg = sweep_config.copy()
    with open_dict(cfg):
        cfg.pop("hydra", None)
        cfg.run_dir = "."
    return to_typed(cfg)


def check_points(points: Sequence[tuple[Sequence[str], TrainConfig]], launcher_gpus: Any) -> None:
    """Every point that asks for GPUs must fit them; and one SLURM array has one shape, so every point must
    ask for the same resources the launcher submits with."""
    problems = []
    shapes = {(c.resources.nodes, c.resources.gpus_per_node, c.resources.ranks_per_node, c.resources.cpus_per_task,
               c.resources.mem_gb)
              for _, c in points}
    if len(shapes) > 1:
        problems.append("the points ask for different resources (nodes, GPUs, ranks, cores, memory), but one launch submits "
                        "one job shape: launch each resources= choice as its own sweep")
    for overrides, cfg in points:
        try:
            check_model_path(cfg.model, loads_here=False)
        except ModelConfigError as e:
            problems.append(f"point [{' '.join(overrides) or 'no overrides'}]: {e}")
        if cfg.resources.gpus_per_node <= 0 and not launcher_gpus:
            continue
        try:
            check_resources(resolve_layout(cfg, on_gpu=True)[0])
        except ResourceError as e:
            problems.append(f"point [{' '.join(overrides) or 'no overrides'}]:\n{e}")
    if problems:
        raise LaunchError("nothing was submitted:\n" + "\n\n".join(problems))
