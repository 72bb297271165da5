"""The physical floor of a problem: no correct kernel can take less time than moving its bytes (inputs read and
outputs written, at least once each) at the machine's memory bandwidth, or than its FLOPs at the device's peak.
A time below it is impossible: the verdict is ``suspect`` (rule ``below_physical_floor``) with both numbers in
``extra["floor"]``.

Cache-aware: a working set that fits in the caches can be read and written far faster than DRAM bandwidth (an
input left in cache, an output whose writes are still in cache when the call ends), so only the bytes beyond
twice the machine's total cache count (at most one cache-full of inputs already there at the start, one of
outputs not yet written back at the end). Small problems therefore have no floor; large ones a safe one. The
bandwidth: on cuda the device's rated figure (memory clock x bus width x 2, or a table by name, the larger);
on cpu a large copy timed once per reference process (per evaluator start), the best of a few. Both are divided
by ``floor_margin`` more (``BenchConfig``), so an honest kernel never meets the floor on a busy machine.

The measuring half runs in the trusted reference process (``machine_figures``, ``count_flops``); the arithmetic
(``floor_record``) in the parent, on the verdict.
"""
from __future__ import annotations

import glob
import time
from typing import Any

from kevin_exp.bench.exchange import header_bytes

# rated DRAM bandwidth (GB/s) and dense tensor-core peak at the lowest precision (TFLOP/s, fp8/int8): the most a
# kernel of any precision could reach. Longest matching name first.
DEVICE_TABLE: list[tuple[str, float, float]] = [
    ("H100 PCIe", 2000.0, 1513.0),
    ("H100 NVL", 3900.0, 1671.0),
    ("H100", 3350.0, 1979.0),
    ("H200", 4800.0, 1979.0),
    ("A100-PCIE-40GB", 1555.0, 624.0),
    ("A100", 2039.0, 624.0),
]
DEFAULT_MARGIN = {"cpu": 4.0, "cuda": 1.5}


def _cuda_figures(device: Any) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(device)
    name = str(props.name)
    rated = 0.0
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0) or 0, getattr(props, "memory_bus_width", 0) or 0
    if clock_khz and bus_bits:
        rated = clock_khz * 1e3 * bus_bits / 8 * 2 / 1e9
    table = next(((bw, peak) for key, bw, peak in DEVICE_TABLE if key in name), (0.0, None))
    bandwidth = max(rated, table[0])
    source = "device properties" if rated >= table[0] and rated else "table by device name"
    return {"bandwidth_gbs": round(bandwidth, 1) if bandwidth else None, "bandwidth_source": source,
            "cache_bytes": int(getattr(props, "L2_cache_size", 0) or 0), "peak_tflops": table[1]}


def cpu_cache_bytes() -> int:
    """All caches of the machine together (each shared cache once): generous, so the floor stays low."""
    seen: set[tuple[str, str, str]] = set()
    total = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu*/cache/index*"):
        try:
            level = open(f"{path}/level").read().strip()
            kind = open(f"{path}/type").read().strip()
            shared = open(f"{path}/shared_cpu_list").read().strip()
            text = open(f"{path}/size").read().strip().upper()
        except OSError:
            continue
        if kind == "Instruction" or (level, kind, shared) in seen:
            continue
        seen.add((level, kind, shared))
        try:
            total += int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
        except ValueError:
            continue
    return total or 64 << 20


def _cpu_figures(repeats: int = 5) -> dict[str, Any]:
    """A copy of a buffer four times the caches, timed ``repeats`` times; the best (read + write bytes / time)."""
    import torch

    cache = cpu_cache_bytes()
    nbytes = min(max(64 << 20, 4 * cache), 512 << 20)
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    del src, dst
    return {"bandwidth_gbs": round(2 * nbytes / best / 1e9, 2), "bandwidth_source": "measured copy",
            "cache_bytes": cache, "peak_tflops": None}


def machine_figures(device: Any) -> dict[str, Any]:
    """The machine's memory bandwidth, its cache and (cuda) the device's peak, measured or looked up here."""
    try:
        return _cuda_figures(device) if getattr(device, "type", "cpu") == "cuda" else _cpu_figures()
    except Exception as exc:  # noqa: BLE001 - without figures there is no floor, never a failed run
        return {"bandwidth_gbs": None, "bandwidth_source": f"unavailable ({type(exc).__name__})", "cache_bytes": 0,
                "peak_tflops": None}


def count_flops(model: Any, inputs: list[Any]) -> float | None:
    """The reference's FLOPs on one call, as torch's flop counter sees its ops (matmuls, convolutions; elementwise
    ops count nothing); None where it cannot count."""
    try:
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*inputs)
        return float(counter.get_total_flops())
    except Exception:  # noqa: BLE001
        return None


def floor_record(figures: dict[str, Any] | None, input_header: dict[str, Any], output_header: dict[str, Any],
                 backend: str, bandwidth_gbs: float, margin: float) -> dict[str, Any] | None:
    """The floor of one problem on this machine, with what it was made from; None without a bandwidth.
    ``bandwidth_gbs`` (> 0) overrides the machine's figure; ``margin`` (0: the backend's default) divides the floor."""
    if not figures:
        return None
    bandwidth = bandwidth_gbs if bandwidth_gbs > 0 else figures.get("bandwidth_gbs")
    if not bandwidth:
        return None
    margin = margin if margin > 0 else DEFAULT_MARGIN.get(backend, 4.0)
    moved = header_bytes(input_header) + header_bytes(output_header)
    cache = int(figures.get("cache_bytes") or 0)
    counted = max(0, moved - 2 * cache)
    bytes_ms = counted / (bandwidth * 1e9 * margin) * 1e3
    flops, peak = figures.get("flops"), figures.get("peak_tflops")
    flops_ms = flops / (peak * 1e12 * margin) * 1e3 if flops and peak else None
    return {"bytes": moved, "bytes_beyond_cache": counted, "cache_bytes": cache, "bandwidth_gbs": bandwidth,
            "bandwidth_source": "setting" if bandwidth_gbs > 0 else figures.get("bandwidth_source"),
            "margin": margin, "bytes_floor_ms": round(bytes_ms, 6), "flops": flops, "peak_tflops": peak,
            "flops_floor_ms": round(flops_ms, 6) if flops_ms is not None else None,
            "floor_ms": round(max(bytes_ms, flops_ms or 0.0), 6)}


def below_floor(record: dict[str, Any] | None, runtime_ms: float) -> bool:
    return bool(record) and record["floor_ms"] > 0 and runtime_ms < record["floor_ms"]
