"""The timing method, the same in the trusted reference process and in the candidate's runner: a cache flush
before each call, CUDA events around it, the timed region closed by a device-wide synchronise."""
from __future__ import annotations

import time
from typing import Any, Callable

import torch


class CacheFlusher:
    """Writes a buffer larger than the last-level cache before each timed call."""

    def __init__(self, device: torch.device) -> None:
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            nbytes = max(2 * int(getattr(props, "L2_cache_size", 0) or 0), 64 << 20)
        else:
            nbytes = 2 * _cpu_llc_bytes()
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def flush(self) -> None:
        self.buffer.fill_(1)


def _cpu_llc_bytes() -> int:
    import glob

    best = 8 << 20
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
            value = int(text.rstrip("KMG"))
            value <<= {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
            best = max(best, value)
        except (OSError, ValueError):
            continue
    return min(best, 128 << 20)


class Timer:
    """Times one call; the timed region ends with a device-wide synchronize so work on any stream counts."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._perf = time.perf_counter
        if device.type == "cuda":
            self._sync = torch.cuda.synchronize
            self._event = torch.cuda.Event

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.device.type == "cuda":
            self._sync()
            start, end = self._event(enable_timing=True), self._event(enable_timing=True)
            start.record()
            out = fn()
            self._sync()  # device-wide: side streams created in C++ are waited for too
            end.record()
            end.synchronize()
            return start.elapsed_time(end), out
        t0 = self._perf()
        out = fn()
        return (self._perf() - t0) * 1e3, out
