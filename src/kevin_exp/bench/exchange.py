"""Tensors between the trusted reference process and the candidate's runner: raw bytes in a shared memory
file (a memfd the parent creates for each runner and hands to it as an inherited descriptor, since the
candidate's sandbox has a private /tmp and /dev/shm, and to the reference process for that runner's run;
its size is sealed before the candidate loads), described by small JSON headers.

A header is ``{"t": "tensor", "dtype", "shape", "offset", "nbytes"}``, ``{"t": "value", "value"}`` (a JSON
number, bool, short string or null) or ``{"t": "list"|"tuple", "items": [...]}``. Nothing here unpickles or imports
anything: a trusted process validates a header (``header_problem``) against what it expects before it reads
a byte, and copies the bytes out before using them.

Layout of the region for one evaluation (``Layout``): the current trial's inputs, then the runner's outputs,
then the runner's inputs as they were after its call; each part starts 64-byte aligned.
"""
from __future__ import annotations

import fcntl
import math
import mmap
import os
from dataclasses import dataclass
from typing import Any

ALIGN = 64
ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
"""The dtypes a header may name (anything else is refused before a byte is read)."""
MAX_STR = 1000


class HeaderError(ValueError):
    """A header that is malformed, names a dtype or place it may not, or does not match what was expected."""


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Layout:
    inputs_at: int
    outputs_at: int
    after_at: int
    size: int

    @staticmethod
    def for_sizes(input_bytes: int, output_bytes: int) -> "Layout":
        inputs_at = 0
        outputs_at = align(input_bytes)
        after_at = outputs_at + align(output_bytes)
        return Layout(inputs_at, outputs_at, after_at, max(ALIGN, after_at + align(input_bytes)))

    def to_json(self) -> dict[str, int]:
        return {"inputs_at": self.inputs_at, "outputs_at": self.outputs_at, "after_at": self.after_at, "size": self.size}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Layout":
        values = [d.get(k) for k in ("inputs_at", "outputs_at", "after_at", "size")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise HeaderError(f"bad layout {d!r}")
        return Layout(*values)


def new_exchange_fd(size: int) -> int:
    """A fresh anonymous shared memory file of ``size`` bytes for one runner (and the reference process while it
    serves that runner), sealed against shrinking (a truncated file would make the reference process's reads
    fault); ``seal_size`` fixes its size for good before any candidate code runs."""
    fd = os.memfd_create("kx-exchange", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, max(size, ALIGN))
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    return fd


def seal_size(fd: int, size: int) -> None:
    """Grow the runner's exchange so that ``size`` bytes fit, then seal it: no process can grow or shrink it, or
    add or remove a seal (a runner's ``ftruncate`` fails with EPERM). Called before the runner loads its candidate;
    the exchange dies with the run, so nothing a candidate writes there reaches another candidate."""
    if os.fstat(fd).st_size < size:
        os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)


def sealed_size(fd: int) -> bool:
    """Whether the file's size is sealed for good (``seal_size``)."""
    want = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
    return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & want == want


def ensure_size(fd: int, size: int) -> None:
    """Grow (it cannot shrink) the shared file so that ``size`` bytes fit."""
    if os.fstat(fd).st_size < size:
        os.ftruncate(fd, size)


class Region:
    """A process's mapping of the shared file, remapped when the file has grown. With ``pin`` (cuda), the mapping
    is page-locked for the GPU (``cudaHostRegister``) so host<->device copies run at full speed; where the
    driver refuses, copies stay pageable (slower, same result)."""

    def __init__(self, fd: int, pin: bool = False) -> None:
        self.fd, self.pin = fd, pin
        self.mm: mmap.mmap | None = None
        self.size = 0
        self.pinned = False
        self._ptr = 0
        self._old: list[mmap.mmap] = []

    def mapped(self, need: int) -> mmap.mmap:
        if self.mm is not None and self.size >= need:
            return self.mm  # a runner's mapping outlives its descriptor (closed before candidate code loads)
        if self.fd < 0:
            raise HeaderError("no shared region is attached")
        if self.mm is None or self.size < need:
            size = os.fstat(self.fd).st_size
            if size < need:
                raise HeaderError(f"the shared region holds {size} bytes, {need} needed")
            if self.mm is not None:
                self._unpin()
                # tensors made by torch.frombuffer may still hold the old mapping's buffer: keep it, never close it
                self._old.append(self.mm)
            self.mm, self.size = mmap.mmap(self.fd, size), size
            if self.pin:
                self._pin()
        return self.mm

    def close(self) -> None:
        """Unmap and close the file (a mapping a tensor still holds is left to the garbage collector)."""
        self._unpin()
        for mm in (*self._old, self.mm):
            if mm is not None:
                try:
                    mm.close()
                except BufferError:
                    pass
        self.mm, self.size, self._old = None, 0, []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _pin(self) -> None:
        import torch

        try:
            self._ptr = torch.frombuffer(self.mm, dtype=torch.uint8, count=1).data_ptr()
            self.pinned = int(torch.cuda.cudart().cudaHostRegister(self._ptr, self.size, 0)) == 0
        except Exception:  # noqa: BLE001 - pinning is an optimisation
            self.pinned = False

    def _unpin(self) -> None:
        if self.pinned:
            import torch

            try:
                torch.cuda.cudart().cudaHostUnregister(self._ptr)
            except Exception:  # noqa: BLE001
                pass
            self.pinned = False


# --------------------------------------------------------------------------- headers (no torch needed)

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def header_bytes(header: Any) -> int:
    """Total tensor bytes a (validated) header describes."""
    t = header.get("t") if isinstance(header, dict) else None
    if t == "tensor":
        return int(header["nbytes"])
    if t in ("list", "tuple"):
        return sum(header_bytes(h) for h in header["items"])
    return 0


def validate(header: Any, start: int, end: int, depth: int = 0) -> None:
    """Raise ``HeaderError`` unless ``header`` is well formed and every tensor lies inside [start, end)."""
    if depth > 4 or not isinstance(header, dict):
        raise HeaderError("malformed header")
    t = header.get("t")
    if t == "value":
        if set(header) != {"t", "value"}:
            raise HeaderError("malformed value header")
        v = header["value"]
        if not (v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= MAX_STR)):
            raise HeaderError("a value header may only carry a number, a bool, a short string or null")
        return
    if t in ("list", "tuple"):
        items = header.get("items")
        if set(header) != {"t", "items"} or not isinstance(items, list) or len(items) > 64:
            raise HeaderError("malformed sequence header")
        for h in items:
            validate(h, start, end, depth + 1)
        return
    if t != "tensor" or set(header) != {"t", "dtype", "shape", "offset", "nbytes"}:
        raise HeaderError("malformed tensor header")
    dtype, shape, offset, nbytes = header["dtype"], header["shape"], header["offset"], header["nbytes"]
    if dtype not in ITEMSIZE:
        raise HeaderError(f"dtype {dtype!r} is not allowed")
    if not isinstance(shape, list) or len(shape) > 8 or not all(_is_int(s) and s >= 0 for s in shape):
        raise HeaderError(f"bad shape {shape!r}")
    if not (_is_int(offset) and _is_int(nbytes)) or offset % ALIGN:
        raise HeaderError("bad offset or size")
    if nbytes != math.prod(shape) * ITEMSIZE[dtype]:
        raise HeaderError(f"{nbytes} bytes do not match shape {shape} of {dtype}")
    if offset < start or offset + nbytes > end:
        raise HeaderError(f"tensor bytes [{offset}, {offset + nbytes}) lie outside [{start}, {end})")


def mismatch(got: Any, expected: Any, where: str = "output") -> str | None:
    """Why a (validated) header does not describe what ``expected`` (a header of the right answer) does; None
    when structure, dtypes and shapes agree. Wording as the model's feedback shows it."""
    tg, te = got.get("t"), expected.get("t")
    if te in ("list", "tuple"):
        if tg not in ("list", "tuple") or len(got["items"]) != len(expected["items"]):
            return f"expected a sequence of {len(expected['items'])} outputs, got {'one tensor' if tg == 'tensor' else tg}"
        for i, (g, e) in enumerate(zip(got["items"], expected["items"])):
            why = mismatch(g, e, f"{where} {i}")
            if why:
                return why
        return None
    if te == "value":
        return None if tg == "value" else f"{where}: expected a plain value, got a {tg}"
    if tg != "tensor":
        return f"{where} must be a plain torch.Tensor, got a {tg}"
    if got["shape"] != expected["shape"]:
        return f"{where} shape {tuple(got['shape'])} != expected {tuple(expected['shape'])}"
    if got["dtype"] != expected["dtype"]:
        return f"{where} dtype torch.{got['dtype']} != expected torch.{expected['dtype']}"
    return None


# --------------------------------------------------------------------------- tensors (torch processes)

class DeviceBytes:
    """Part of the region kept in device memory (``device_exchange``): ``tensor`` (uint8) holds the region's bytes
    [``base``, ``base`` + its length); headers keep the region's offsets, so where a value lies reads the same."""

    def __init__(self, tensor: Any, base: int) -> None:
        self.tensor, self.base = tensor, base

    def __len__(self) -> int:
        return self.base + self.tensor.numel()

    def at(self, offset: int, nbytes: int) -> Any:
        if offset < self.base or offset + nbytes > len(self):
            raise HeaderError(f"bytes [{offset}, {offset + nbytes}) lie outside the device region [{self.base}, {len(self)})")
        return self.tensor.narrow(0, offset - self.base, nbytes)


Target = mmap.mmap | DeviceBytes


def raw_bytes(target: Any, offset: int, nbytes: int) -> Any:
    """The region's bytes [offset, offset + nbytes) as a uint8 tensor: host memory (a mapping) or device memory
    (``DeviceBytes``), without copying."""
    import torch

    if isinstance(target, DeviceBytes):
        return target.at(offset, nbytes)
    return torch.frombuffer(target, dtype=torch.uint8, count=nbytes, offset=offset)


def write_values(values: Any, mm: Target, offset: int, end: int | None = None,
                 serial: bool = False) -> tuple[dict[str, Any], int]:
    """Write the tensors of ``values`` (a tensor, a number, or a list/tuple of them) at ``offset``, below ``end``
    (on cuda: one copy each, device to host, or device to device into ``DeviceBytes``); the header and the offset
    after them. Refuses anything else. With
    ``serial``, a contiguous host tensor is copied by the calling thread alone (``memmove``): a parallel copy
    waits for every thread of the pool to be scheduled, which on a busy machine can take tens of
    milliseconds, and the runner makes these copies inside the parent's clock."""
    import torch

    end = len(mm) if end is None else min(end, len(mm))

    if isinstance(values, torch.Tensor):
        if type(values) is not torch.Tensor:
            raise HeaderError(f"must be a plain torch.Tensor, got {type(values).__module__}.{type(values).__name__}")
        if values.layout != torch.strided or values.is_meta:
            raise HeaderError(f"must be a dense tensor, got layout {values.layout}")
        dtype = str(values.dtype).removeprefix("torch.")
        if dtype not in ITEMSIZE:
            raise HeaderError(f"dtype {values.dtype} is not supported")
        nbytes = values.numel() * values.element_size()
        if offset + nbytes > end:
            raise HeaderError(f"{nbytes} bytes are more than the expected outputs take")
        if nbytes:
            dst = raw_bytes(mm, offset, nbytes)
            src = values.detach().contiguous()
            if serial and src.device.type == "cpu" and dst.device.type == "cpu":
                import ctypes

                ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
            else:
                dst.copy_(src.reshape(-1).view(torch.uint8))
        header = {"t": "tensor", "dtype": dtype, "shape": list(values.shape), "offset": offset, "nbytes": nbytes}
        return header, align(offset + nbytes)
    if isinstance(values, (list, tuple)):
        items = []
        for v in values:
            h, offset = write_values(v, mm, offset, end, serial)
            items.append(h)
        return {"t": "tuple" if isinstance(values, tuple) else "list", "items": items}, offset
    if values is None or isinstance(values, (bool, int, float)) or (isinstance(values, str) and len(values) <= MAX_STR):
        return {"t": "value", "value": values}, offset
    raise HeaderError(f"cannot pass a {type(values).__name__} (tensors, numbers and lists of them only)")


def read_values(header: dict[str, Any], mm: Target, device: Any) -> Any:
    """The values a validated header describes, copied out of the region onto ``device``."""
    import torch

    t = header["t"]
    if t == "value":
        return header["value"]
    if t in ("list", "tuple"):
        items = [read_values(h, mm, device) for h in header["items"]]
        return items if t == "list" else tuple(items)
    dtype = getattr(torch, header["dtype"])
    shape = header["shape"]
    if header["nbytes"] == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    raw = raw_bytes(mm, header["offset"], header["nbytes"])
    return raw.view(dtype).reshape(shape).to(device=device, copy=True)


def describe(values: Any) -> dict[str, Any]:
    """A header for ``values`` without writing them (offsets 0): for sizes and expected shapes."""
    import torch

    if isinstance(values, torch.Tensor):
        dtype = str(values.dtype).removeprefix("torch.")
        return {"t": "tensor", "dtype": dtype, "shape": list(values.shape), "offset": 0,
                "nbytes": values.numel() * values.element_size()}
    if isinstance(values, (list, tuple)):
        return {"t": "tuple" if isinstance(values, tuple) else "list", "items": [describe(v) for v in values]}
    plain = values is None or isinstance(values, (bool, int, float, str))
    return {"t": "value", "value": values if plain else None}


def padded_bytes(header: dict[str, Any]) -> int:
    """Bytes the described tensors take in the region, each aligned."""
    t = header["t"]
    if t == "tensor":
        return align(header["nbytes"])
    if t in ("list", "tuple"):
        return sum(padded_bytes(h) for h in header["items"])
    return 0
