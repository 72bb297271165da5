"""Timing reference and candidate: interleaved trials on fixed input buffers, a cache flush before each
call, a device-wide synchronise at the end of each timed region, and periodic output checks."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.worker.comparison import compare_outputs
from kevin_exp.bench.worker.outcomes import Rejected
from kevin_exp.bench.worker.tensors import clone_values, copy_into, synchronize


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


@dataclass
class TimingResult:
    ref_ms: list[float] = field(default_factory=list)
    new_ms: list[float] = field(default_factory=list)


def interleaved_timing(
    ref_model: Any,
    new_model: Any,
    input_sets: list[list[Any]],
    ref_outputs: list[Any],
    device: torch.device,
    config: BenchConfig,
) -> TimingResult:
    """Reference and candidate timed alternately with the same method, on fixed input buffers whose
    values cycle between distinct input sets: a kernel that caches by pointer or skips repeated
    calls returns stale results, which the periodic checks catch."""
    flusher = CacheFlusher(device)
    timer = Timer(device)
    ref_buf = clone_values(input_sets[0])
    new_buf = clone_values(input_sets[0])
    with torch.no_grad():
        for _ in range(config.warmup_trials):
            ref_model(*ref_buf)
            new_model(*new_buf)
        synchronize(device)
        result = TimingResult()
        n_sets = len(input_sets)
        for i in range(config.timed_trials):
            k = i % n_sets
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for which in order:
                buf = ref_buf if which == 0 else new_buf
                model = ref_model if which == 0 else new_model
                copy_into(buf, input_sets[k])
                flusher.flush()
                ms, out = timer(lambda: model(*buf))
                (result.ref_ms if which == 0 else result.new_ms).append(ms)
                check = config.timing_check_every and (i % config.timing_check_every == 0 or i >= config.timed_trials - n_sets)
                if which == 1 and check:
                    cmp = compare_outputs(ref_outputs[k], out, config)
                    if not cmp.ok:
                        raise Rejected(
                            "incorrect",
                            f"wrong output during timed trial {i} ({cmp.reason}); kernels must recompute "
                            "on every call (no caching across calls)",
                        )
                del out
    return result
