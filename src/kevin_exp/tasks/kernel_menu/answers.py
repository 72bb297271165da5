"""A kernel-menu answer: the first option letter the response names, and the candidate program it stands for.

An answer is a few tokens: ``C``, ``C.``, ``Option C`` or ``A (profile)`` all answer C or A. The first capital letter
standing alone that names an option counts (so an ``A`` used as a word before it is read as written: the policy
learns to answer with the letter first). A response naming none is a format error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kevin_exp.tasks.kernel_menu.menu import LETTERS, MenuProblem

OPTIONS = LETTERS
# a letter that is part of a name (C++, C#, P-value, A.B) is no answer
_OPTION = re.compile(r"(?<![A-Za-z0-9_+#.-])([" + "".join(OPTIONS) + r"])(?![A-Za-z0-9_+#]|[.-][A-Za-z0-9])")


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


def option_in(text: str) -> str:
    """The first option letter standing alone in ``text`` ("" when there is none)."""
    match = _OPTION.search(text)
    return match.group(1) if match else ""


def parse_menu_answer(text: str, problem: MenuProblem, backend: str, profiled: bool) -> MenuAnswer:
    """``profiled``: whether an earlier turn of the trajectory took the profile (``A`` then submits the fast kernel, not the probe)."""
    letter = option_in(text)
    if not letter:
        return MenuAnswer("", None, f"no option letter found in the answer; answer with one of {', '.join(OPTIONS)}")
    return MenuAnswer(letter, problem.candidate(letter, backend, profiled))
