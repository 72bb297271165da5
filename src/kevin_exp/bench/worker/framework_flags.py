"""Framework flags that change numerics or which kernels run (TF32, reduced-precision reductions, cuDNN benchmark
and determinism, matmul precision, oneDNN, thread counts, flush-to-zero), read in the runner before any
candidate code loads and compared after every call: a candidate that flips one (from C++ through a symbol the
static rules cannot see, or from Python by a spelling they miss) is ``forbidden`` (rule ``framework_flags``).

The getters are the C functions themselves, looked up once when the snapshot is taken, so replacing
``torch.backends.*`` attributes or the module-level getters afterwards cannot change what is read.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

# the flag's name as a user would spell it -> the torch._C getter behind it (absent ones are skipped)
_C_GETTERS = {
    "torch.backends.cuda.matmul.allow_tf32": "_get_cublas_allow_tf32",
    "torch.backends.cudnn.allow_tf32": "_get_cudnn_allow_tf32",
    "torch.backends.cudnn.benchmark": "_get_cudnn_benchmark",
    "torch.backends.cudnn.deterministic": "_get_cudnn_deterministic",
    "torch.backends.cudnn.enabled": "_get_cudnn_enabled",
    "torch.get_float32_matmul_precision()": "_get_float32_matmul_precision",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": "_get_cublas_allow_fp16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": "_get_cublas_allow_bf16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_fp16_accumulation": "_get_cublas_allow_fp16_accumulation",
    "torch.backends.cpu.allow_fp16_reduced_precision_reduction": "_get_cpu_allow_fp16_reduced_precision_reduction",
    "torch.backends.mkldnn.enabled": "_get_mkldnn_enabled",
    "torch.backends.mkldnn.deterministic": "_get_mkldnn_deterministic",
    "onednn allow_tf32": "_get_onednn_allow_tf32",
    "torch.are_deterministic_algorithms_enabled()": "_get_deterministic_algorithms",
    "torch.is_deterministic_algorithms_warn_only_enabled()": "_get_deterministic_algorithms_warn_only",
    "deterministic fill of uninitialised memory": "_get_deterministic_fill_uninitialized_memory",
    "torch.backends.cuda.flash_sdp_enabled()": "_get_flash_sdp_enabled",
    "torch.backends.cuda.mem_efficient_sdp_enabled()": "_get_mem_efficient_sdp_enabled",
    "torch.backends.cuda.math_sdp_enabled()": "_get_math_sdp_enabled",
    "torch.backends.cuda.cudnn_sdp_enabled()": "_get_cudnn_sdp_enabled",
    "torch.get_num_threads()": "get_num_threads",
    "torch.get_num_interop_threads()": "get_num_interop_threads",
    "torch.get_default_dtype()": "get_default_dtype",
}


def _flush_to_zero_probe() -> Callable[[], bool]:
    """Whether this thread flushes denormal floats to zero (MXCSR FTZ/DAZ on x86, as ``torch.set_flush_denormal``
    or ``_mm_setcsr`` set it): there is no getter, so a denormal is made and multiplied by one (with the functions
    as they are now, before candidate code can replace them)."""
    full, mul, item, no_grad = torch.full, torch.Tensor.mul, torch.Tensor.item, torch.no_grad

    def probe() -> bool:
        with no_grad():
            return item(mul(full((1,), 1e-39, dtype=torch.float32), 1.0)) == 0.0
    return probe


class FlagSnapshot:
    """The flags' values when taken, and the getters to read them again."""

    def __init__(self) -> None:
        self.getters: dict[str, Callable[[], Any]] = {}
        for name, attr in _C_GETTERS.items():
            fn = getattr(torch._C, attr, None)
            if fn is None:
                continue
            try:
                fn()
            except Exception:  # noqa: BLE001 - a getter this build lacks support for is not read
                continue
            self.getters[name] = fn
        self.getters["flush denormals to zero (FTZ/DAZ)"] = _flush_to_zero_probe()
        self.values = self.read()

    def read(self) -> dict[str, str]:
        values = {}
        for name, fn in self.getters.items():
            try:
                values[name] = repr(fn())
            except Exception as exc:  # noqa: BLE001 - a getter that now fails is a change
                values[name] = f"<{type(exc).__name__}>"
        return values

    def changed(self) -> list[str]:
        """``name: before -> now`` for every flag that is not what it was."""
        now = self.read()
        return [f"{k}: {v} -> {now.get(k)}" for k, v in self.values.items() if now.get(k) != v]
