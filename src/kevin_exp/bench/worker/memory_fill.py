"""Memory the harness fills or reads as a candidate would, on the host by the calling thread alone (a parallel
fill waits for every thread of the pool to be scheduled): the allocator poisoned with NaN before a call
(``poison_allocator``), and the calibration stand-in's output (``zeros_like``) and its reads of the inputs
(``input_reader``), so that what the parent's clock sees of a stand-in's call is what it sees of a candidate's."""
from __future__ import annotations

from typing import Any, Callable

import torch

from kevin_exp.bench.worker.final_output import tensor_leaves as final_leaves
from kevin_exp.bench.worker.tensors import synchronize


def zeros_like(header: dict[str, Any], device: torch.device, serial: bool = False) -> Any:
    """The stand-in's output. With ``serial`` a host tensor is zeroed by the calling thread alone, where an honest
    single-threaded kernel writes its output: the copy to the region after the call then finds it as it finds
    the candidate's."""
    t = header["t"]
    if t == "tensor":
        dtype = getattr(torch, header["dtype"])
        if serial and device.type == "cpu":
            import ctypes

            out = torch.empty(header["shape"], dtype=dtype)
            ctypes.memset(out.data_ptr(), 0, out.numel() * out.element_size())
            return out
        return torch.zeros(header["shape"], dtype=dtype, device=device)
    if t in ("list", "tuple"):
        items = [zeros_like(h, device, serial) for h in header["items"]]
        return items if t == "list" else tuple(items)
    return header.get("value")


def input_reader(inputs: list[Any], device: torch.device) -> Callable[[], None]:
    """Reads every byte of the host inputs by the calling thread (into a scratch buffer made now), as a forward
    reads its inputs: the stand-in's inputs are then as warm as a candidate's when the runner copies them to the
    region after the call (a no-op on cuda, whose copies come from device memory)."""
    import ctypes

    pairs = [(t.data_ptr(), t.numel() * t.element_size()) for t in final_leaves(inputs)
             if device.type == "cpu" and t.is_contiguous()]
    scratch = ctypes.create_string_buffer(max([n for _, n in pairs], default=1))

    def read() -> None:
        for ptr, n in pairs:
            ctypes.memmove(scratch, ptr, n)
    return read


def poison_allocator(expected: dict[str, Any], device: torch.device, copies: int = 3) -> None:
    """Leave NaN in freed allocator blocks of the output's size, so an output the kernel never writes shows."""
    headers = expected["items"] if expected.get("t") in ("list", "tuple") else [expected]
    held = []
    for h in headers:
        if h.get("t") != "tensor":
            continue
        dtype = getattr(torch, h["dtype"])
        fill: float | int = float("nan") if dtype.is_floating_point else (1 if dtype in (torch.bool, torch.uint8, torch.int8) else -1234567)
        for _ in range(copies):
            held.append(filled(h["shape"], fill, dtype, device))
    synchronize(device)
    del held


def filled(shape: list[int], fill: float | int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.full``, on the host by the calling thread alone (a pattern doubled by ``memmove``): a parallel fill
    waits for every thread of the pool to be scheduled, tens of milliseconds per call on a busy machine."""
    if device.type != "cpu":
        return torch.full(shape, fill, dtype=dtype, device=device)
    import ctypes

    out = torch.empty(shape, dtype=dtype)
    total = out.numel() * out.element_size()
    seed = min(out.numel(), 1024)
    if not seed:
        return out
    out.view(-1)[:seed] = torch.full((seed,), fill, dtype=dtype)
    done, base = seed * out.element_size(), out.data_ptr()
    while done < total:
        step = min(done, total - done)
        ctypes.memmove(base + done, base, step)
        done += step
    return out
