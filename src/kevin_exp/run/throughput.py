"""Per-step resource and throughput figures: peak memory, trained tokens per second, and an MFU estimate.

MFU = 6 x parameters x trained tokens / training time / (peak bf16 FLOP/s per GPU x GPUs): the usual dense
transformer estimate (forward 2N, backward 4N per token; attention's own FLOPs and the recomputation of
activation checkpointing and of the old log-probs' forward are left out, so it slightly understates the work).
"""
from __future__ import annotations

import resource
import sys

import torch

# dense bf16 tensor-core peak (no sparsity) per GPU, by a substring of torch.cuda.get_device_name(); the
# first match wins, so the narrower names come first
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM (NVIDIA H100 80GB HBM3)
    ("H200", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
)


def peak_flops(device_name: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None


def device_peak_flops(device: torch.device) -> float | None:
    """None on a CPU, or on a GPU missing from the table."""
    if device.type != "cuda":
        return None
    return peak_flops(torch.cuda.get_device_name(device))


def mfu(params: int, tokens: float, seconds: float, peak_per_gpu: float | None, gpus: int) -> float | None:
    if peak_per_gpu is None or seconds <= 0:
        return None
    return 6.0 * params * tokens / seconds / (peak_per_gpu * gpus)


def gpu_peak_gb(device: torch.device) -> float:
    """Peak allocated GPU memory since the last ``reset_gpu_peak`` (0 on a CPU)."""
    if device.type != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_gpu_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def host_rss_peak_gb() -> float:
    """This process's peak resident memory so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # bytes on macOS, KiB on Linux
