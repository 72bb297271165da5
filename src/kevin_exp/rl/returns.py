"""Discounted per-turn returns within one trajectory (Kevin section 4.3).

sum form: R_t = sum_{i>=t} gamma^(i-t) r_i        max form: R_t = max_{i>=t} gamma^(i-t) r_i
A turn never gets credit from turns before it.
"""
from __future__ import annotations

from typing import Sequence


def discounted_returns(rewards: Sequence[float], gamma: float, aggregation: str = "sum") -> list[float]:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma}: must lie in [0, 1]")
    if aggregation not in ("sum", "max"):
        raise ValueError(f"aggregation={aggregation!r}: expected 'sum' or 'max'")
    out = [0.0] * len(rewards)
    running: float | None = None
    for t in range(len(rewards) - 1, -1, -1):
        r = float(rewards[t])
        if running is None:
            running = r
        elif aggregation == "sum":
            running = r + gamma * running
        else:
            running = max(r, gamma * running)
        out[t] = running
    return out
