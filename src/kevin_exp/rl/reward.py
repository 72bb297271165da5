"""Per-turn score of one kernel (Kevin section 3.2): 0.3 * correct + speedup * correct, the speedup optionally capped.

The one place that says a speedup counts only for a correct kernel (``counted_speedup``): the score, the next
turn's feedback and the records all take a turn's speedup from it."""
from __future__ import annotations


def counted_speedup(correct: bool, speedup: float | None) -> float | None:
    """The speedup a turn is credited with: its kernel's when that kernel is correct, else none (a suspect
    verdict is not ``correct``)."""
    return speedup if correct else None


def turn_score(correct: bool, speedup: float | None, correctness_weight: float = 0.3, speedup_weight: float = 1.0,
               max_speedup: float | None = None) -> float:
    """Failed, forbidden, unparsable, incorrect and suspect turns score 0.
    ``max_speedup`` (None or 0: no cap) caps the speedup term."""
    counted = counted_speedup(correct, speedup)
    if counted is None:
        return 0.0
    counted = float(counted)
    if max_speedup:
        counted = min(counted, float(max_speedup))
    return correctness_weight + speedup_weight * counted
