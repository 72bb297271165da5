"""Find KernelBench-format problems: a KernelBench checkout or the built-in suite.

A problem file is ``level{N}/<number>_<Name>.py``; its number is the leading integer of the file name.
Problems come back sorted by (level, number).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from kevin_exp.errors import UserError
from kevin_exp.tasks.problem import BUILTIN_ROOT, Problem

_PROBLEM_FILE = re.compile(r"^(\d+)_.*\.py$")


class UnknownProblemError(UserError):
    """An id passed to :func:`select` names no loaded problem."""


def _scan_level(folder: Path, level: int, suite: str) -> list[Problem]:
    problems = []
    for path in folder.iterdir():
        match = _PROBLEM_FILE.match(path.name)
        if not match or not path.is_file():
            continue
        number = int(match.group(1))
        problems.append(
            Problem(
                problem_id=f"{suite}/level{level}/{number}",
                name=path.stem,
                level=level,
                number=number,
                source=path.read_text(),
                path=path,
                suite=suite,
            )
        )
    problems.sort(key=lambda p: p.number)
    for a, b in zip(problems, problems[1:]):
        if a.number == b.number:
            raise ValueError(f"{folder}: two problems numbered {a.number} ({a.path.name}, {b.path.name}); rename one")
    return problems


def _levels_folder(root: Path) -> Path:
    """The folder holding ``level1/``, ``level2/`` ...: ``root/KernelBench`` or ``root`` itself."""
    for candidate in (root / "KernelBench", root):
        if any(candidate.glob("level[0-9]*")):
            return candidate
    return root / "KernelBench"


def load_kernelbench(root: str | Path, levels: Sequence[int] = (1, 2)) -> list[Problem]:
    """Problems of a KernelBench checkout (``root/KernelBench/level{N}/*.py``; ``root`` may also be the
    folder that holds ``level1/`` directly), sorted by (level, number)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"KernelBench folder {root} not found: pass the path of a KernelBench checkout "
            "(the folder holding KernelBench/level1), e.g. git clone https://github.com/ScalingIntelligence/KernelBench"
        )
    base = _levels_folder(root)
    problems: list[Problem] = []
    for level in levels:
        folder = base / f"level{level}"
        if not folder.is_dir():
            raise FileNotFoundError(
                f"KernelBench level folder {folder} not found: pass a KernelBench checkout that has level{level} "
                f"(the folder holding KernelBench/level{level}) or drop level {level} from the levels asked for"
            )
        found = _scan_level(folder, level, "kernelbench")
        if not found:
            raise FileNotFoundError(
                f"KernelBench level folder {folder} holds no problem files (<number>_<Name>.py): "
                "check the checkout is complete, or drop that level"
            )
        problems.extend(found)
    return problems


def builtin_levels() -> list[int]:
    """Levels the built-in suite has."""
    levels = []
    for folder in BUILTIN_ROOT.glob("level[0-9]*"):
        if folder.is_dir() and folder.name[5:].isdigit():
            levels.append(int(folder.name[5:]))
    return sorted(levels)


def load_builtin(levels: Sequence[int] | None = None) -> list[Problem]:
    """The built-in suite (small problems with cpu and cuda sizes and reference solutions)."""
    available = builtin_levels()
    wanted = available if levels is None else list(levels)
    problems: list[Problem] = []
    for level in wanted:
        if level not in available:
            raise FileNotFoundError(
                f"built-in suite has no level {level} (folder {BUILTIN_ROOT / f'level{level}'}); "
                f"choose from levels {available}"
            )
        problems.extend(_scan_level(BUILTIN_ROOT / f"level{level}", level, "builtin"))
    return problems


def select(problems: Iterable[Problem], ids: Sequence[str]) -> list[Problem]:
    """The problems named by ``ids`` (problem ids such as ``builtin/level1/3``), in the order given.

    Raises :class:`UnknownProblemError` (a ValueError) naming every id that matches no problem.
    """
    pool = sorted(problems, key=lambda p: (p.suite, p.level, p.number))
    by_id = {p.problem_id: p for p in pool}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        known = [p.problem_id for p in pool]
        shown = ", ".join(known[:8]) + (f", ... ({len(known)} in all)" if len(known) > 8 else "")
        raise UnknownProblemError(
            f"unknown problem id(s) {', '.join(map(repr, unknown))}: ids look like '<suite>/level<N>/<number>'; "
            f"known: {shown or 'none (no problems loaded)'}"
        )
    selected: list[Problem] = []
    seen: set[str] = set()
    for i in ids:
        if i not in seen:
            seen.add(i)
            selected.append(by_id[i])
    return selected

