"""Per-turn score of one kernel (Kevin section 3.2): 0.3 * correct + speedup * correct, the speedup optionally capped."""
from __future__ import annotations


def turn_score(correct: bool, speedup: float | None, correctness_weight: float = 0.3, speedup_weight: float = 1.0,
               max_speedup: float | None = None) -> float:
    """Failed, forbidden, unparsable, incorrect and suspect turns score 0 (a suspect verdict is not ``correct``).
    ``max_speedup`` (None or 0: no cap) caps the speedup term."""
    if not correct or speedup is None:
        return 0.0
    speedup = float(speedup)
    if max_speedup:
        speedup = min(speedup, float(max_speedup))
    return correctness_weight + speedup_weight * speedup
