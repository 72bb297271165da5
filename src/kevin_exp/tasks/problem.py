"""One KernelBench-format problem: the reference program's source plus where it came from."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"
"""Folder of the built-in suite: ``level{N}/<n>_<Name>.py`` problems and ``solutions/<backend>/level{N}/``."""

BACKENDS = ("cpu", "cuda")


@dataclass(frozen=True)
class Problem:
    """A KernelBench-format reference program.

    ``source`` defines ``Model``, ``get_inputs`` and ``get_init_inputs`` (and, for built-in problems,
    ``BACKEND_SIZES``: per-backend overrides of the module-level size constants).
    """

    # "builtin/level1/3" or "kernelbench/level2/17"
    problem_id: str
    # file stem, e.g. "3_Softmax"
    name: str
    level: int
    # leading integer of the file name
    number: int
    source: str
    path: Path
    # "builtin" or "kernelbench"
    suite: str

    def solution(self, backend: str) -> str | None:
        """Source of the reference candidate (a ``ModelNew`` built with ``load_inline``) for ``backend``.

        Only built-in problems ship solutions; returns None when there is none.
        """
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
        if self.suite != "builtin":
            return None
        path = BUILTIN_ROOT / "solutions" / backend / f"level{self.level}" / f"{self.name}.py"
        return path.read_text() if path.is_file() else None

    def __repr__(self) -> str:  # the source is long: keep reprs to one line
        return f"Problem({self.problem_id!r}, name={self.name!r})"
