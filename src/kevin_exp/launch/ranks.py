"""One process per GPU: starting a run's ranks and joining them into one process group.

A run asks for ``resources.nodes x resources.ranks_per_node`` ranks (one per GPU; CPU ranks on a node without
GPUs). Who starts them depends on how the job was launched:

- ``python -m kevin_exp.train resources=h200x8``: no launcher has set ``RANK``, so the Hydra job of each point
  starts its ranks itself through torch's elastic launcher API (``spawn_local_ranks``); every rank runs the same
  command as an ordinary Hydra job whose folder is the point's (``hydra.run.dir``), and the starting process only
  waits for them;
- ``torchrun --nproc_per_node N -m kevin_exp.train ...``: torchrun has set ``RANK``/``WORLD_SIZE``; nothing is
  started again, and the run records the world torchrun gave it;
- ``cluster=<SLURM profile>``: submitit starts ``tasks_per_node`` tasks per node (one per rank) that each run the
  Hydra job; ``rank_env_from_slurm`` exports the rank, the world and the master address from SLURM's task
  (submitit's ``TorchDistributedEnvironment``) without hiding the other GPUs: a rank's GPU is ``cuda:LOCAL_RANK``.

Every rank then joins the process group (``join_run``: gloo on CPU, nccl on GPU) before the run is built.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from kevin_exp.config import TrainConfig, world_size_problems
from kevin_exp.errors import LaunchError
from kevin_exp.launch.world import SELF_WORLD_ENV, DistContext, context_from_env, forget_inherited_world, init_process_group
from kevin_exp.records.run_records import read_jsonl
from kevin_exp.run.setup import resolve_device
from kevin_exp.run.signals import Interrupted

_joined: list[dict[str, Any]] = []
# set by spawn_local_ranks for the ranks it starts: the pid of the process that started them
LAUNCHER_PID_ENV = "KEVIN_EXP_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1



def launched_ranks(env: dict[str, str] | None = None) -> bool:
    """A launcher (torchrun, the elastic launcher, submitit via ``rank_env_from_slurm``) has placed this
    process in a world: nothing must be started again."""
    if env is None:
        forget_inherited_world()
        env = os.environ
    return "RANK" in env and "WORLD_SIZE" in env and SELF_WORLD_ENV not in env


def rank_env_from_slurm() -> bool:
    """In a SLURM job of several tasks started by submitit: export RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for this task. Returns whether it did."""
    if launched_ranks() or os.environ.get("SUBMITIT_EXECUTOR") != "slurm":
        return False
    if int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return False
    from submitit.helpers import TorchDistributedEnvironment

    # set_cuda_visible_devices=True would hide the other GPUs while LOCAL_RANK kept its value, and a rank
    # uses cuda:LOCAL_RANK
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True


def wants_local_spawn(cfg: TrainConfig, cluster_launch: bool) -> bool:
    """This Hydra job must start the run's ranks itself: more than one asked for, none started by a launcher."""
    if launched_ranks() or cluster_launch or cfg.resources.world_size == 1:
        return False
    if cfg.resources.nodes > 1:
        raise LaunchError(
            f"resources.nodes={cfg.resources.nodes}: a run of several nodes starts its ranks through a cluster "
            "launch (cluster=<SLURM profile>) or `torchrun --nnodes ...` on each node; this command starts ranks "
            "on this machine only (resources.nodes=1)")
    return True


def spawn_local_ranks(cfg: TrainConfig, overrides: list[str], run_dir: str, module: str = "kevin_exp.train") -> None:
    """Starts ``resources.ranks_per_node`` ranks on this machine through torch's elastic launcher, each running
    ``python -m <module> <overrides>`` as a Hydra job in ``run_dir``, and waits for them. A rank that fails
    stops the others; its exit status is this job's."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    n = cfg.resources.ranks_per_node
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"kevin-exp-{uuid.uuid4().hex[:12]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2)
    args = ["-m", module, *overrides, f"hydra.run.dir={run_dir}"]
    # the ranks end with this process, also when it is killed outright (end_with_launcher)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    print(f"starting {n} ranks: {' '.join(overrides) or 'no overrides'} -> {run_dir}", flush=True)
    try:
        elastic_launch(config, entrypoint=sys.executable)(*args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(f"rank {rank} of {n} failed (exit status {failure.exitcode}); the other ranks were stopped",
              file=sys.stderr, flush=True)
        raise SystemExit(failure.exitcode if failure.exitcode > 0 else 1) from None
    except SignalException as e:
        # the launcher's agent got the signal (the ranks run in sessions of their own) and has passed it on to the
        # ranks and waited for them to end: a Ctrl-C is then this job's own (exits_on_ctrl_c says how to resume)
        if e.sigval == signal.SIGINT:
            raise Interrupted from None
        print(f"stopped by {signal.Signals(e.sigval).name}: the {n} ranks were stopped", file=sys.stderr, flush=True)
        raise SystemExit(128 + int(e.sigval)) from None
    finally:  # a later job of a sweep may run in this process
        os.environ.pop(LAUNCHER_PID_ENV, None)


def as_launched(cfg: TrainConfig, ctx: DistContext) -> TrainConfig:
    """The config with the world the launcher actually started (torchrun may start another number of ranks
    than the resources ask for): the records carry what the run used."""
    r = cfg.resources
    if ctx.world_size == r.world_size and ctx.local_world_size == r.ranks_per_node:
        return cfg
    nodes = max(1, ctx.world_size // max(1, ctx.local_world_size))
    gpus = max(r.gpus_per_node, ctx.local_world_size) if r.gpus_per_node else 0
    if ctx.is_main:
        print(f"the launcher started {ctx.world_size} ranks ({nodes} node(s) x {ctx.local_world_size}); "
              f"resources asked for {r.world_size}: recording resources.nodes={nodes} "
              f"resources.ranks_per_node={ctx.local_world_size}", flush=True)
    return dataclasses.replace(cfg, resources=dataclasses.replace(r, nodes=nodes, ranks_per_node=ctx.local_world_size,
                                                                  gpus_per_node=gpus))


def dist_timeout_s(cfg: TrainConfig) -> float:
    """The trainer's own timeout for collectives where it has one, else the resources'."""
    return float(getattr(cfg.trainer, "dist_timeout_s", None) or cfg.resources.dist_timeout_s)


def uses_cuda(cfg: TrainConfig) -> bool:
    import torch

    device = cfg.trainer.device
    return torch.cuda.is_available() and (device == "auto" or device.startswith("cuda"))


def join_run(cfg: TrainConfig, ctx: DistContext | None = None) -> DistContext:
    """Joins the run's process group (a no-op for one rank): nccl with this rank's GPU selected
    (``cuda:LOCAL_RANK``) on a GPU, gloo otherwise. Every rank then tells the others where it runs; rank 0
    records that list (``joined_ranks``)."""
    import torch

    ctx = ctx or context_from_env()
    end_with_launcher()
    _joined.clear()
    me = {"rank": ctx.rank, "local_rank": ctx.local_rank, "host": socket.gethostname(), "pid": os.getpid()}
    if not ctx.distributed:
        return ctx
    cuda = uses_cuda(cfg)
    if cuda:
        device = resolve_device(cfg.trainer.device)  # the trainer's choice of this rank's GPU
        torch.cuda.set_device(device)
        me["device"] = str(device)
    init_process_group(ctx, "nccl" if cuda else "gloo", dist_timeout_s(cfg))
    gathered: list[Any] = [None] * ctx.world_size
    torch.distributed.all_gather_object(gathered, me)
    _joined.extend(gathered)
    return ctx


def end_with_launcher() -> None:
    """A rank started by ``spawn_local_ranks`` is killed when the process that started it dies, however it dies:
    a launcher killed with SIGKILL cannot stop its ranks, which would run on beside a restarted run and write
    into its folder. (torchrun and SLURM end their own ranks.)"""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not launched_ranks() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(launcher):  # it died before the request above was in place
        os._exit(1)


def joined_ranks() -> list[dict[str, Any]]:
    """The ranks that joined this process's run (empty for a run of one process)."""
    return list(_joined)


def leave_run() -> None:
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _joined.clear()


def check_trainer_for_ranks(cfg: TrainConfig) -> None:
    """What the run's ranks (the launcher's, or those the resources ask for) cannot run with these settings (a
    trainer that spreads over ranks, whole tasks per rank), refused before any rank is started."""
    r = cfg.resources
    world = context_from_env().world_size if launched_ranks() else r.world_size
    problems = world_size_problems(cfg, world)
    if problems:
        who = (f"the launcher started {world} ranks" if launched_ranks() else
               f"resources ask for {world} ranks ({r.nodes} node(s) x resources.ranks_per_node={r.ranks_per_node})")
        raise LaunchError(f"{who}: " + "; ".join(problems))


def final_reward(run_dir: str | Path) -> float:
    """The last step's mean reward, the value a sweeper optimises (0 before any step)."""
    metrics = read_jsonl(Path(run_dir) / "metrics.jsonl")
    return float(metrics[-1]["reward_mean"]) if metrics else 0.0
