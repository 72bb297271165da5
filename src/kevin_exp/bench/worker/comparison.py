"""Judging the candidate's outputs against the reference's (in the trusted reference process): exact type,
layout, shape, dtype, finite values and tolerance; inputs left unchanged, bit for bit."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def same_values(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    return a == b


_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def same_bits(a: Any, b: Any) -> bool:
    """Equal structure, dtypes and shapes, and every element the same bits (a NaN input left alone is unchanged;
    ``torch.equal`` would call it changed)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.device != b.device:
            b = b.to(a.device)
        view = _INT_VIEW[a.element_size()]
        return bool(torch.equal(a.view(view), b.view(view))) if a.numel() else True
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    return a == b


@dataclass
class Comparison:
    ok: bool
    reason: str = ""
    max_abs_diff: float = 0.0


def compare_outputs(ref: Any, out: Any, config: Any) -> Comparison:
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(ref):
            return Comparison(False, f"expected a sequence of {len(ref)} outputs, got {type(out).__name__}")
        worst = Comparison(True)
        for i, (r, o) in enumerate(zip(ref, out)):
            c = compare_outputs(r, o, config)
            if not c.ok:
                return Comparison(False, f"output {i}: {c.reason}", c.max_abs_diff)
            worst.max_abs_diff = max(worst.max_abs_diff, c.max_abs_diff)
        return worst
    if not isinstance(ref, torch.Tensor):
        return Comparison(out == ref, "" if out == ref else f"expected {ref!r}, got {out!r}")
    # Exact type: a subclass could compute lazily inside the comparison (hack 9).
    if type(out) is not torch.Tensor:
        return Comparison(False, f"output must be a plain torch.Tensor, got {type(out).__module__}.{type(out).__name__}")
    if out.layout != torch.strided or out.is_meta or out.device != ref.device:
        return Comparison(False, f"output must be a dense tensor on {ref.device}, got layout {out.layout} on {out.device}")
    if out.shape != ref.shape:
        return Comparison(False, f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Comparison(False, f"output dtype {out.dtype} != expected {ref.dtype}")
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        bad = int((~torch.isfinite(out)).sum())
        return Comparison(False, f"output has {bad} NaN/Inf values (unwritten or uninitialised memory?)")
    tol = config.tolerance_for(str(ref.dtype).removeprefix("torch."))
    diff = (out.double() - ref.double()).abs()
    max_diff = float(diff.max()) if diff.numel() else 0.0
    if not bool(torch.allclose(out, ref, atol=tol.atol, rtol=tol.rtol)):
        bad = int((diff > tol.atol + tol.rtol * ref.double().abs()).sum())
        return Comparison(
            False,
            f"output mismatch: {bad} of {ref.numel()} elements outside atol={tol.atol}, rtol={tol.rtol}; "
            f"max abs diff {max_diff:.4g}",
            max_diff,
        )
    return Comparison(True, "", max_diff)
