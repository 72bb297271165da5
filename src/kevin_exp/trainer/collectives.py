"""The few collectives the distributed step needs, each a no-op in a world of one (no process group)."""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def _device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo reduces CPU ones
    if active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0; None elsewhere."""
    if not active():
        return [obj]
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def reduce_values(values: Sequence[float], op: str) -> list[float]:
    """Element-wise sum or max of ``values`` over ranks, in float64."""
    if not active():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return [float(v) for v in t.cpu()]


def max_int(value: int) -> int:
    return int(reduce_values([value], "max")[0])


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if active():
        dist.barrier()
