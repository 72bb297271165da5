"""The kernel menu: KernelBench-format reference programs, each with a menu of real kernels behind its options.

Every reference has five kernels (``KINDS``): a fast one, a slow one, a wrong one, one that does not build, and
the profile's probe. The menu has four options, the same for every reference; each turn names them with its own
symbols (``SYMBOLS``: ``A``-``D`` on turn 1, ``E``-``H`` on turn 2, and so on in turn), so that what the policy
learns to answer on one turn is not, by the symbol alone, what it answers on the other:

- the first option profiles the kernel: it submits the probe, a copy of the input that computes nothing (so it is
  not correct and scores 0); once a profile was taken, the first option submits the fast kernel it found;
- the second submits the kernel as it stands, the slow one; the third the wrong kernel, the fourth the one that
  does not build.

So the profile costs its own turn (0, where the slow kernel scores about 0.3) and pays only on a later one: the
move that a discount of 0 cannot credit (docs/learning.md). A task is one reference
(``kernel_menu/level1/<number>``).
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
# each turn's names for the four options, in turn: turn t uses SYMBOLS[(t - 1) % len(SYMBOLS)]
SYMBOLS = (("A", "B", "C", "D"), ("E", "F", "G", "H"))
# what each option submits, by its place in the menu, before a profile was taken and after (the first changes)
BEFORE_PROFILE = ("probe", "slow", "off_by_one", "broken")
AFTER_PROFILE = ("fast", *BEFORE_PROFILE[1:])


def symbols(turn: int) -> tuple[str, ...]:
    """The option names of ``turn`` (1 for the first)."""
    return SYMBOLS[(turn - 1) % len(SYMBOLS)]
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
    def kind_of(option: str, turn: int, profiled: bool) -> str:
        """The kind of kernel an answer of ``turn`` submits, once a profile was taken (``profiled``) or not."""
        return (AFTER_PROFILE if profiled else BEFORE_PROFILE)[symbols(turn).index(option)]

    @staticmethod
    def kinds_played(answers: Sequence[str]) -> list[str]:
        """The kind each answer of one trajectory (turn 1 first) submitted ("" for an answer naming no option): an
        answer submits what its option stood for after the turns before it."""
        kinds, profiled = [], False
        for turn, option in enumerate(answers, start=1):
            kind = MenuProblem.kind_of(option, turn, profiled) if option else ""
            profiled = profiled or kind == "probe"
            kinds.append(kind)
        return kinds

    def program(self, kind: str, backend: str) -> str:
        """The candidate program of one kind of this reference's menu, for ``backend``."""
        if backend not in MENU_BACKENDS:
            raise ValueError(f"backend={backend!r}: the kernel menu has kernels for {', '.join(MENU_BACKENDS)} only")
        return cpu_program(kind, EXPRESSIONS[self.name], name=f"kernel_menu_{self.number}_{kind}")

    def candidate(self, option: str, turn: int, backend: str, profiled: bool) -> str:
        """The program an answer of ``turn`` submits."""
        return self.program(self.kind_of(option, turn, profiled), backend)

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
