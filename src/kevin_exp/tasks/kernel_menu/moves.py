"""What a kernel-menu run's policy did, step by step, from its transcripts: how often turn 1 probed, how often a
turn after a probe answered the letter the probe showed as fast, and how often the last turn submitted the fast
kernel. These are the moves the design turns on (docs/learning.md); rewards alone do not tell them apart."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from kevin_exp.tasks.kernel_menu.menu import KIND_CODES, LETTERS, PROBE

_KIND_OF_CODE = {code: kind for kind, code in KIND_CODES.items()}


def deal_of(task_id: str) -> tuple[str, ...]:
    """The deal a kernel-menu task id carries (its last part: one code letter per kind, A to E)."""
    code = task_id.rsplit("/", 1)[-1]
    if not task_id.startswith("kernel_menu/") or len(code) != len(LETTERS) or set(code) - set(_KIND_OF_CODE):
        raise ValueError(f"{task_id!r} is not a kernel-menu task id (kernel_menu/level<N>/<number>/<deal>)")
    return tuple(_KIND_OF_CODE[c] for c in code)


def fast_letter(task_id: str) -> str:
    return LETTERS[deal_of(task_id).index("fast")]


def _share(hits: list[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def move_shares(rows: Iterable[dict[str, Any]]) -> dict[int, dict[str, float | None]]:
    """Per step, from transcript rows (``task_id``, ``trajectory``, ``turn``, ``summary``: the answer's letter):
    ``probe_first`` (turn-1 answers that probed), ``read_after_probe`` (answers on the turn after a probe that named
    the fast letter it showed), ``fast_last`` (last-turn answers naming the fast kernel). None where nothing counts."""
    by_trajectory: dict[tuple[int, str, int], dict[int, str]] = defaultdict(dict)
    for row in rows:
        by_trajectory[row["step"], row["task_id"], row["trajectory"]][row["turn"]] = row["summary"]
    counts: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for (step, task_id, _), answers in by_trajectory.items():
        fast, last = fast_letter(task_id), max(answers)
        counts[step]["probe_first"].append(answers.get(1) == PROBE)
        counts[step]["fast_last"].append(answers[last] == fast)
        for turn, answer in answers.items():
            if answers.get(turn - 1) == PROBE:
                counts[step]["read_after_probe"].append(answer == fast)
    names = ("probe_first", "read_after_probe", "fast_last")
    return {step: {name: _share(c[name]) for name in names} for step, c in sorted(counts.items())}
