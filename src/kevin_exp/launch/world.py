"""Where this process sits in a multi-process run: its rank, the world, and the process group.

One process per GPU (or per CPU rank in tests). The launcher (torch's elastic launcher, ``torchrun``, or
submitit on SLURM) sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``; a plain single-process run sets none of them and is rank 0 of a world of 1, with no
process group.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        """The one process that writes what is written once (provenance, ledger, W&B run, tables)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def context_from_env(env: dict[str, str] | None = None) -> DistContext:
    env = dict(os.environ) if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", str(rank)))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}")
    return DistContext(rank, world, local_rank, local_world)


def init_process_group(ctx: DistContext, backend: str, timeout_s: float) -> None:
    """Join the run's process group (a no-op in a world of 1). ``timeout_s`` bounds every collective: it
    must outlast the longest phase one rank can spend alone (generation and kernel evaluation), not
    NCCL's default."""
    if not ctx.distributed or torch.distributed.is_initialized():
        return
    torch.distributed.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size,
                                         timeout=datetime.timedelta(seconds=timeout_s))


# set where a process exported the variables below itself, for a world of one (join_process_group): its pid
# and the values it set
SELF_WORLD_ENV = "KEVIN_EXP_SELF_WORLD"
WORLD_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def forget_inherited_world() -> None:
    """A process started by one that had joined a world of one on its own inherits that world's variables: they
    are no launcher's, so drop them (unless a launcher has set its own since, as torchrun does)."""
    raw = os.environ.get(SELF_WORLD_ENV)
    if raw is None:
        return
    try:
        mark = json.loads(raw)
    except ValueError:
        mark = {}
    if mark.get("pid") == os.getpid():
        return
    del os.environ[SELF_WORLD_ENV]
    if all(os.environ.get(k) == mark.get(k) for k in WORLD_ENV):
        for k in WORLD_ENV:
            os.environ.pop(k, None)


def join_process_group(ctx: DistContext, device: torch.device, timeout_s: float) -> None:
    """The run's process group, made once (the launcher, the generator's engine or the learner may ask first): a
    world of one gets its own, since DeepSpeed and vLLM's external-launcher engine always need one."""
    os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))
    if device.type == "cuda" and device.index is not None:  # a bare "cuda" means the current device already
        torch.cuda.set_device(device)
    if torch.distributed.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if ctx.distributed:
        init_process_group(ctx, backend, timeout_s)
        return
    # DeepSpeed and vLLM's external launcher read these; the marker tells launch.launched_ranks that no launcher
    # set them (a later job of the same process may still start ranks of its own)
    forget_inherited_world()
    if "RANK" not in os.environ:
        os.environ.update(MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"), MASTER_PORT=str(_free_port()),
                          RANK="0", WORLD_SIZE="1")
        os.environ[SELF_WORLD_ENV] = json.dumps({"pid": os.getpid(), **{k: os.environ[k] for k in WORLD_ENV}})
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("WORLD_SIZE", "1")
    torch.distributed.init_process_group(backend, rank=0, world_size=1, timeout=datetime.timedelta(seconds=timeout_s))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
