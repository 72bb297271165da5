"""The kernel menu: KernelBench-format reference programs, each with a menu of real kernels dealt to letters.

Every reference has five kernels (``KINDS``: fast, slow, two wrong ones, one that does not build). A task of the
suite is one reference with one *deal*: the order in which its five kernels sit behind the letters A to E. The
prompt never says the order; a task's id does (``kernel_menu/level1/<number>/<deal>``, the deal as one code letter
per kind, e.g. ``fsohb``: A fast, B slow, C off by one, D half, E broken). The answer ``P`` (the probe) submits the
slow kernel and reveals the deal. Every deal of every reference is a task, so a policy cannot learn which letter is
fast from the prompt: only a turn's feedback tells (docs/learning.md).
"""
from __future__ import annotations

import ast
import functools
import itertools
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from kevin_exp.tasks.kernel_menu.cpu_kernels import cpu_program
from kevin_exp.tasks.problem import Problem

MENU_ROOT = Path(__file__).resolve().parent
KINDS = ("fast", "slow", "off_by_one", "half", "broken")
KIND_CODES = {"fast": "f", "slow": "s", "off_by_one": "o", "half": "h", "broken": "b"}
LETTERS = ("A", "B", "C", "D", "E")
PROBE = "P"
# the kernel a probe submits
PROBE_KIND = "slow"
MENU_BACKENDS = ("cpu",)

# each reference's per-element function in C++ (of ``float v``): what every kind of its menu computes
EXPRESSIONS = {
    "1_Scale_Shift_ReLU_Clamp_Square": "square(std::min(std::max(std::max(v * 1.5f + 0.5f, 0.0f) - 0.25f * v, -1.0f), 2.0f)) + v",
    "2_Polynomial": "((((v * 0.5f + 0.25f) * v - 1.0f) * v + 0.5f) * v + 2.0f)",
}


@dataclass(frozen=True, repr=False)
class MenuProblem(Problem):
    """One reference with one deal: ``deal[i]`` is the kind of kernel behind ``LETTERS[i]``."""

    deal: tuple[str, ...] = field(default=KINDS)

    def kind_of(self, letter: str) -> str:
        """The kind of kernel an answer submits (the probe submits ``PROBE_KIND``)."""
        return PROBE_KIND if letter == PROBE else self.deal[LETTERS.index(letter)]

    def letter_of(self, kind: str) -> str:
        return LETTERS[self.deal.index(kind)]

    def program(self, kind: str, backend: str) -> str:
        """The candidate program of one kind of this reference's menu, for ``backend``."""
        if backend not in MENU_BACKENDS:
            raise ValueError(f"backend={backend!r}: the kernel menu has kernels for {', '.join(MENU_BACKENDS)} only")
        return cpu_program(kind, EXPRESSIONS[self.name], name=f"kernel_menu_{self.number}_{kind}")

    def candidate(self, letter: str, backend: str) -> str:
        """The program an answer (a letter or the probe) submits."""
        return self.program(self.kind_of(letter), backend)

    def solution(self, backend: str) -> str | None:
        return self.program("fast", backend)


@functools.lru_cache(maxsize=None)
def forward_body(source: str) -> str:
    """The statements of ``Model.forward`` in a reference program, dedented (what the menu prompt shows of it)."""
    tree = ast.parse(source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    forward = next(n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    lines = source.splitlines()[forward.body[0].lineno - 1 : forward.body[-1].end_lineno]
    return textwrap.dedent("\n".join(lines))


def deal_code(deal: tuple[str, ...]) -> str:
    return "".join(KIND_CODES[k] for k in deal)


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
    """Every deal of every reference of ``levels``: 120 tasks per reference, sorted by (reference, deal)."""
    problems = []
    for level, number, path in menu_references(levels):
        source = path.read_text()
        for deal in itertools.permutations(KINDS):
            problems.append(MenuProblem(
                problem_id=f"kernel_menu/level{level}/{number}/{deal_code(deal)}", name=path.stem, level=level,
                number=number, source=source, path=path, suite="kernel_menu", deal=deal,
            ))
    return problems
