"""Per-turn score of one kernel (Kevin section 3.2): 0.3 * correct + speedup * correct."""
from __future__ import annotations


def turn_score(correct: bool, speedup: float | None, correctness_weight: float = 0.3, speedup_weight: float = 1.0) -> float:
    """Failed, forbidden, unparsable or incorrect turns score 0; the speedup is raw, not capped."""
    if not correct or speedup is None:
        return 0.0
    return correctness_weight + speedup_weight * float(speedup)
