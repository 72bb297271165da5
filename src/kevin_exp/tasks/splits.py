"""Named task splits: Kevin's 180 training / 20 held-out KernelBench tasks (ids in split_ids/), or everything."""
from __future__ import annotations

import hashlib
from pathlib import Path

from kevin_exp.tasks.problem import Problem

SPLITS = ("all", "kevin_train", "kevin_holdout")
SPLIT_IDS = Path(__file__).resolve().parent / "split_ids"


def holdout_rule(level: int, per_level: int = 10, numbers: range = range(1, 101)) -> list[int]:
    """How kevin_holdout.txt was drawn: the numbers with the smallest hash, so the split never depends on a seed."""
    key = lambda n: hashlib.sha256(f"kevin-exp holdout/level{level}/{n}".encode()).hexdigest()  # noqa: E731
    return sorted(sorted(numbers, key=key)[:per_level])


def kevin_holdout_ids() -> list[str]:
    lines = (SPLIT_IDS / "kevin_holdout.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def apply_split(pool: list[Problem], split: str) -> list[Problem]:
    if split not in SPLITS:
        raise ValueError(f"tasks.split={split!r}: expected one of {', '.join(SPLITS)}")
    if split == "all":
        return pool
    if any(p.suite != "kernelbench" for p in pool):
        raise ValueError(f"tasks.split={split}: Kevin's splits are of KernelBench (tasks=kernelbench); "
                         "use tasks.split=all for the built-in suite, or tasks.ids=[...]")
    held = set(kevin_holdout_ids())
    in_levels_1_2 = [p for p in pool if p.level in (1, 2)]
    if split == "kevin_holdout":
        return [p for p in in_levels_1_2 if p.problem_id in held]
    return [p for p in in_levels_1_2 if p.problem_id not in held]
