"""What a kernel-menu run's policy did, step by step, from its transcripts: how often turn 1 took the profile, how
often a turn after a profile submitted the fast kernel, and how often the last turn submitted the fast kernel.
These are the moves the design turns on (docs/learning.md); rewards alone do not tell them apart."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from kevin_exp.tasks.kernel_menu.menu import MenuProblem

NAMES = ("profile_first", "fast_after_profile", "fast_last")


def _share(hits: list[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def move_shares(rows: Iterable[dict[str, Any]]) -> dict[int, dict[str, float | None]]:
    """Per step, from transcript rows (``step``, ``task_id``, ``trajectory``, ``turn``, ``summary``: the answer's
    letter): ``profile_first`` (turn-1 answers that took the profile), ``fast_after_profile`` (answers on the turn
    after a profile that submitted the fast kernel), ``fast_last`` (last turns that submitted the fast kernel).
    None where nothing counts."""
    by_trajectory: dict[tuple[int, str, int], dict[int, str]] = defaultdict(dict)
    for row in rows:
        by_trajectory[row["step"], row["task_id"], row["trajectory"]][row["turn"]] = row["summary"]
    counts: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for (step, _, _), answers in by_trajectory.items():
        kinds = MenuProblem.kinds_played([answers[t] for t in sorted(answers)])
        counts[step]["profile_first"].append(kinds[0] == "probe")
        counts[step]["fast_last"].append(kinds[-1] == "fast")
        for before, kind in zip(kinds, kinds[1:]):
            if before == "probe":
                counts[step]["fast_after_profile"].append(kind == "fast")
    return {step: {name: _share(c[name]) for name in NAMES} for step, c in sorted(counts.items())}
