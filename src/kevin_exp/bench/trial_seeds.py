"""Each call's input seed, derived from the evaluation's secret seed: the parent (which sends a seeded runner its
call's seed) and the reference process (which draws the same inputs) derive it alike; the secret itself never
reaches the runner."""
from __future__ import annotations

import hashlib


def trial_seed(secret: int, index: int) -> int:
    """Call ``index``'s input seed."""
    digest = hashlib.sha256(f"{secret}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
