"""What lets a call's tensors stay on the device: inputs both trusted sides draw from the call's seed, a
fingerprint that shows both drew the same, and the positions a warm-up or timed call is checked at.

Every call's inputs come from ``trial_seed(secret, i)``. When a problem's ``get_inputs`` is deterministic for a
seed (``Problem.seeded``), the runner is sent that call's seed (one call's, at staging: the evaluation's
secret stays in the reference process) and draws the inputs on its own device instead of receiving them
through host memory; ``fingerprint`` of both sides' inputs must agree. The runner copies every call's whole
output, and its inputs as the call left them, into the shared region before it answers "ran"; a warm-up or
timed call is then checked by the reference process at ``SAMPLE_POSITIONS`` positions per output tensor, and
as many per input tensor, drawn from a seed only the reference process and the parent know
(``sampled_in_region``); checked calls (before and after timing) compare every element of both.
"""
from __future__ import annotations

from typing import Any

import torch

from kevin_exp.bench.exchange import HeaderError, raw_bytes, read_values

SAMPLE_POSITIONS = 4096
_FINGERPRINT_ELEMENTS = 4096
_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def fingerprint(values: Any) -> list[Any]:
    """Per leaf: dtype, shape and an exact, order-independent integer sum of the bits of up to 4,096 evenly
    spread elements (tensors), or the value itself (numbers). Two processes drawing the same inputs agree
    whatever their thread counts."""
    return resolve_fingerprint(fingerprint_lazy(values))


def fingerprint_lazy(values: Any) -> list[Any]:
    """``fingerprint`` with each sum left on the tensor's device (no synchronization): many calls' fingerprints
    are then drawn with one wait (``resolve_fingerprint``)."""
    out: list[Any] = []
    for v in leaves(values):
        if isinstance(v, torch.Tensor):
            flat = v.detach().reshape(-1)
            step = max(1, flat.numel() // _FINGERPRINT_ELEMENTS)
            picked = flat[::step].contiguous()
            bits = picked.view(_INT_VIEW[picked.element_size()]) if picked.numel() else picked.to(torch.int64)
            out.append([str(v.dtype).removeprefix("torch."), list(v.shape), bits.to(torch.int64).sum()])
        else:
            out.append(v if v is None or isinstance(v, (bool, int, float, str)) else repr(type(v)))
    return out


def resolve_fingerprint(lazy: list[Any]) -> list[Any]:
    return resolve_fingerprints([lazy])[0]


def resolve_fingerprints(lazies: list[list[Any]]) -> list[list[Any]]:
    """Many ``fingerprint_lazy`` results resolved with one wait per device (one copy of all their sums)."""
    sums = [e[2] for lazy in lazies for e in lazy if isinstance(e, list) and isinstance(e[2], torch.Tensor)]
    values: dict[int, int] = {}
    for device in {t.device for t in sums}:
        mine = [t for t in sums if t.device == device]
        values.update(zip(map(id, mine), torch.stack(mine).tolist()))
    return [[[e[0], e[1], values[id(e[2])]] if isinstance(e, list) and isinstance(e[2], torch.Tensor) else e
             for e in lazy] for lazy in lazies]


def leaves(values: Any) -> list[Any]:
    """The leaves of a value (a tensor, a number, or nested lists/tuples of them), in order."""
    if isinstance(values, (list, tuple)):
        return [leaf for v in values for leaf in leaves(v)]
    return [values]


def positions(numel: int, seed: int, leaf: int) -> torch.Tensor:
    """The flat positions a timed call's output tensor ``leaf`` is checked at: every element of a small tensor,
    else ``SAMPLE_POSITIONS`` drawn from ``seed`` (CPU generator: the same in every process)."""
    if numel <= SAMPLE_POSITIONS:
        return torch.arange(numel)
    g = torch.Generator().manual_seed((seed + 1_000_003 * leaf) % (1 << 63))
    return torch.randint(0, numel, (SAMPLE_POSITIONS,), generator=g)


def input_seed(seed: int) -> int:
    """The seed of the positions a call's inputs are checked at, from its output's sample seed (another stream
    of positions: the outputs' and the inputs' do not coincide)."""
    import hashlib

    return int.from_bytes(hashlib.sha256(f"inputs:{seed}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def sampled_in_region(header: dict[str, Any], mm: Any, seed: int) -> list[Any]:
    """``sampled`` of the values a validated header describes in the shared region (a mapping, or
    ``exchange.DeviceBytes``), read in place (only the sampled elements are copied out, into host memory): what the
    reference process checks a call at."""
    leaf_headers = header["items"] if header.get("t") in ("list", "tuple") else [header]
    out: list[Any] = []
    for j, h in enumerate(_header_leaves(leaf_headers)):
        if h.get("t") != "tensor" or not h["nbytes"]:
            out.append(read_values(h, mm, "cpu"))
            continue
        dtype = getattr(torch, h["dtype"])
        flat = raw_bytes(mm, h["offset"], h["nbytes"]).view(dtype)
        out.append(flat[positions(flat.numel(), seed, j).to(flat.device)].cpu())
    return out


def _header_leaves(headers: list[Any]) -> list[Any]:
    return [leaf for h in headers for leaf in (_header_leaves(h["items"]) if h.get("t") in ("list", "tuple") else [h])]


def sampled(values: Any, seed: int) -> list[Any]:
    """The values at ``positions`` of each tensor leaf (1-D, on the tensor's device), numbers as they are.
    Refuses what ``exchange.write_values`` refuses: anything but plain dense tensors."""
    out: list[Any] = []
    for j, v in enumerate(leaves(values)):
        if isinstance(v, torch.Tensor):
            _plain(v)
            out.append(v.detach().reshape(-1)[positions(v.numel(), seed, j).to(v.device)])
        else:
            out.append(v)
    return out


def to_host(rows: list[list[Any]]) -> list[list[Any]]:
    """Rows of ``sampled`` values (1-D tensors on any device, numbers) in host memory: each device's tensors come
    back in one copy, where a copy per tensor would wait on the device each time. A caller that samples each
    output as it is made keeps only the sampled values on the device, never the outputs."""
    picks = [(k, j, v) for k, row in enumerate(rows) for j, v in enumerate(row) if isinstance(v, torch.Tensor)]
    out = [list(row) for row in rows]
    for device in {v.device for *_, v in picks}:
        mine = [p for p in picks if p[2].device == device]
        raw = torch.cat([v.detach().reshape(-1).view(torch.uint8) for *_, v in mine]).cpu()
        at = 0
        for k, j, v in mine:
            n = v.numel() * v.element_size()
            out[k][j] = raw[at:at + n].clone().view(v.dtype)  # a copy of its own: aligned for its dtype
            at += n
    return out


def _plain(v: torch.Tensor) -> None:
    if type(v) is not torch.Tensor:
        raise HeaderError(f"must be a plain torch.Tensor, got {type(v).__module__}.{type(v).__name__}")
    if v.layout != torch.strided or v.is_meta:
        raise HeaderError(f"must be a dense tensor, got layout {v.layout}")
