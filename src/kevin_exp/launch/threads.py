"""A job's thread counts, from its resources, so jobs that share a machine (a local multirun, a local SLURM
node) each use their share of the cores.

torch, OpenMP and MKL otherwise start one thread per core in every job; a few jobs on the same cores then
run several times more busy threads than cores, and each job runs several times slower than its share.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kevin_exp.config import ResourcesConfig

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: what SLURM or taskset grants, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


def local_ranks_sharing_cores(env: dict[str, str] | None = None) -> int:
    """How many ranks of this node run on the same cores as this one: all the node's ranks (LOCAL_WORLD_SIZE),
    unless SLURM bound each task to cores of its own (a task/affinity or task/cgroup binding)."""
    env = os.environ if env is None else env
    ranks = int(env.get("LOCAL_WORLD_SIZE", "1"))
    bind = env.get("SLURM_CPU_BIND_TYPE", "").strip(" ,")
    if bind and bind != "none" and env.get("SLURM_CPU_BIND_LIST"):
        return 1
    return max(1, ranks)


def thread_count(resources: ResourcesConfig, env: dict[str, str] | None = None) -> int:
    """The job's (one rank's) share of the cores: ``resources.cpus_per_task``, at most the cores it may run on
    divided among the node's ranks that share them, so the ranks of one node (their threads, compilers and
    workers) together use about the node's cores and no more."""
    share = usable_cores() // local_ranks_sharing_cores(env)
    return max(1, min(resources.cpus_per_task, share))


def apply_thread_limits(resources: ResourcesConfig) -> int:
    """Sets this process's torch threads and its children's OpenMP/MKL/OpenBLAS threads to
    ``thread_count(resources)`` and returns that number. Safe to call again."""
    import torch

    threads = thread_count(resources)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # settable once per process, and only before inter-op work has started
        pass
    # this process's OpenMP and MKL read these at start-up; torch.set_num_threads covers them here
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(threads)
    return threads
