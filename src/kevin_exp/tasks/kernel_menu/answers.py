"""A kernel-menu answer: the first option the response names, and the candidate program it stands for.

An answer is a few tokens: ``C``, ``C.``, ``Option C`` or ``A (profile)`` all answer C or A on turn 1, ``F`` or
``F.`` answer F on turn 2. The first of the turn's option symbols standing alone counts (so an ``A`` used as a word
before it is read as written: the policy learns to answer with the option first). A response naming none is a
format error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_exp.tasks.kernel_menu.menu import SYMBOLS, MenuProblem, symbols


def _option_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    # a symbol that is part of a name or a number (C++, C#, P-value, A.B, 12, 1.5) is no answer
    return re.compile(r"(?<![A-Za-z0-9_+#.-])([" + "".join(names) + r"])(?![A-Za-z0-9_+#]|[.-][A-Za-z0-9])")


_PATTERNS = {names: _option_pattern(names) for names in SYMBOLS}


@dataclass(frozen=True)
class MenuAnswer:
    # the option named ("" when none was)
    letter: str
    # the program the evaluator receives (None: a format error)
    candidate: str | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.candidate is not None


def option_in(text: str, turn: int) -> str:
    """The first of ``turn``'s options standing alone in ``text`` ("" when there is none)."""
    match = _PATTERNS[symbols(turn)].search(text)
    return match.group(1) if match else ""


def parse_menu_answer(text: str, problem: MenuProblem, backend: str, turn: int, profiled: bool) -> MenuAnswer:
    """``profiled``: whether an earlier turn of the trajectory took the profile (the first option then submits the
    fast kernel, not the probe)."""
    option = option_in(text, turn)
    if not option:
        return MenuAnswer("", None, f"no option found in the answer; answer with one of {', '.join(symbols(turn))}")
    return MenuAnswer(option, problem.candidate(option, turn, backend, profiled))
