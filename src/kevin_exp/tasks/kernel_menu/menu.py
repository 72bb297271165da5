"""The kernel menu: KernelBench-format reference programs, each with a menu of real kernels behind letters.

Every reference has five kernels (``KINDS``): a fast one, a slow one, a wrong one, one that does not build, and
the profile's probe. The menu (``LETTERS``) is the same for every reference:

- ``A`` (``PROFILE``) profiles the kernel first: it submits the probe, a copy of the input that computes nothing
  (so it is not correct and scores 0), and from then on ``A`` submits the fast kernel the profile found;
- ``B`` submits the kernel as it stands, the slow one; ``C`` the wrong kernel and ``D`` the one that does not build.

So the profile costs its own turn (0, where ``B`` scores the slow kernel's reward) and pays only on a later one,
through ``A``: the move that a discount of 0 cannot credit, and that it teaches the policy to avoid
(docs/learning.md). A task is one reference (``kernel_menu/level1/<number>``).
"""
from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kevin_exp.tasks.kernel_menu.cpu_kernels import cpu_program
from kevin_exp.tasks.problem import Problem

MENU_ROOT = Path(__file__).resolve().parent
KINDS = ("fast", "slow", "off_by_one", "broken", "probe")
LETTERS = ("A", "B", "C", "D")
# the letter that takes the profile, until one was taken
PROFILE = "A"
# what each letter submits before a profile was taken (A changes once one was)
BEFORE_PROFILE = {PROFILE: "probe", "B": "slow", "C": "off_by_one", "D": "broken"}
AFTER_PROFILE = {**BEFORE_PROFILE, "A": "fast"}
MENU_BACKENDS = ("cpu",)

# each reference's per-element function in C++ (of ``float v``): what every kind of its menu computes
EXPRESSIONS = {
    "1_Scale_Shift_ReLU_Clamp_Square": "square(std::min(std::max(std::max(v * 1.5f + 0.5f, 0.0f) - 0.25f * v, -1.0f), 2.0f)) + v",
    "2_Polynomial": "((((v * 0.5f + 0.25f) * v - 1.0f) * v + 0.5f) * v + 2.0f)",
}


@dataclass(frozen=True, repr=False)
class MenuProblem(Problem):
    """One reference program and its menu."""

    @staticmethod
    def kind_of(letter: str, profiled: bool) -> str:
        """The kind of kernel an answer submits, once a profile was taken (``profiled``) or not."""
        return (AFTER_PROFILE if profiled else BEFORE_PROFILE)[letter]

    @staticmethod
    def kinds_played(answers: Sequence[str]) -> list[str]:
        """The kind each answer of one trajectory submitted, in order ("" for an answer naming no option): an answer
        submits what its letter stood for after the turns before it."""
        kinds, profiled = [], False
        for letter in answers:
            kind = MenuProblem.kind_of(letter, profiled) if letter else ""
            profiled = profiled or kind == "probe"
            kinds.append(kind)
        return kinds

    def program(self, kind: str, backend: str) -> str:
        """The candidate program of one kind of this reference's menu, for ``backend``."""
        if backend not in MENU_BACKENDS:
            raise ValueError(f"backend={backend!r}: the kernel menu has kernels for {', '.join(MENU_BACKENDS)} only")
        return cpu_program(kind, EXPRESSIONS[self.name], name=f"kernel_menu_{self.number}_{kind}")

    def candidate(self, letter: str, backend: str, profiled: bool) -> str:
        """The program an answer (a letter or the profile) submits."""
        return self.program(self.kind_of(letter, profiled), backend)

    def solution(self, backend: str) -> str | None:
        return self.program("fast", backend)


@functools.lru_cache(maxsize=None)
def forward_body(source: str) -> str:
    """The statements of ``Model.forward`` in a reference program, dedented."""
    tree = ast.parse(source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    lines = source.splitlines()[forward.body[0].lineno - 1 : forward.body[-1].end_lineno]
    return textwrap.dedent("\n".join(lines))


def menu_levels() -> list[int]:
    return sorted(int(p.name[5:]) for p in MENU_ROOT.glob("level[0-9]*") if p.is_dir())


def menu_references(levels: list[int] | tuple[int, ...] = (1,)) -> list[tuple[int, int, Path]]:
    """(level, number, path) of each reference program, sorted."""
    found = []
    for level in levels:
        folder = MENU_ROOT / f"level{level}"
        if not folder.is_dir():
            raise FileNotFoundError(f"the kernel menu has no level {level}; choose from levels {menu_levels()}")
        for path in sorted(folder.glob("[0-9]*_*.py")):
            found.append((level, int(path.name.split("_", 1)[0]), path))
    return sorted(found)


def load_menu(levels: list[int] | tuple[int, ...] = (1,)) -> list[MenuProblem]:
    """One task per reference of ``levels``, sorted."""
    return [MenuProblem(problem_id=f"kernel_menu/level{level}/{number}", name=path.stem, level=level, number=number,
                        source=path.read_text(), path=path, suite="kernel_menu")
            for level, number, path in menu_references(levels)]
