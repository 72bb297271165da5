"""The runner's snapshot of framework flags: a flip from C++ (through torch._C's setters here) or by any Python
spelling is seen, even after the Python getters were replaced; an unchanged process reports nothing."""
from __future__ import annotations

import torch

from kevin_exp.bench.worker.framework_flags import FlagSnapshot


def test_an_unchanged_process_reports_no_change():
    snap = FlagSnapshot()
    assert snap.changed() == []
    assert "torch.backends.cudnn.benchmark" in snap.values and "torch.get_float32_matmul_precision()" in snap.values
    assert "flush denormals to zero (FTZ/DAZ)" in snap.values


def test_flips_are_seen_even_with_the_getters_replaced(monkeypatch):
    snap = FlagSnapshot()
    before = (torch._C._get_cudnn_benchmark(), torch.get_float32_matmul_precision(), torch._C._get_mkldnn_enabled())
    monkeypatch.setattr(torch._C, "_get_cudnn_benchmark", lambda: before[0])
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: before[1])
    monkeypatch.setattr(torch.Tensor, "mul", lambda self, other: self)
    try:
        torch._C._set_cudnn_benchmark(not before[0])
        torch.set_float32_matmul_precision("medium")
        torch._C._set_mkldnn_enabled(not before[2])
        torch.set_flush_denormal(True)
        changed = " | ".join(snap.changed())
        for name in ("torch.backends.cudnn.benchmark", "torch.get_float32_matmul_precision()",
                     "torch.backends.mkldnn.enabled", "flush denormals to zero"):
            assert name in changed, changed
    finally:
        torch._C._set_cudnn_benchmark(before[0])
        torch.set_float32_matmul_precision(before[1])
        torch._C._set_mkldnn_enabled(before[2])
        torch.set_flush_denormal(False)
    assert snap.changed() == []
