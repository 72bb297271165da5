"""The README's Layout section is a tree with one line per module of the package: every module is in it, and
everything in it exists."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "kevin_exp"


def _tree_modules() -> set[str]:
    """The modules the tree names, as paths under src/kevin_exp (folders nest by two spaces)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    names: set[str] = set()
    stack: list[tuple[int, str]] = []
    inside = False
    for line in block.splitlines():
        m = re.match(r"( *)(\S+)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        if indent == 0:
            inside, stack = name == "src/kevin_exp/", []
            continue
        if not inside:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([*(s[1].rstrip("/") for s in stack), name])
        if name.endswith("/"):
            stack.append((indent, name))
        elif name.endswith(".py"):
            names.add(path)
    return names


def _imported(path: Path) -> bool:
    """A module of the package (every folder up to it is a package), not a task's program shipped as data."""
    return all((folder / "__init__.py").is_file() for folder in path.parents if folder.is_relative_to(PACKAGE))


def test_every_module_is_in_the_readme_tree_and_every_entry_exists():
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and _imported(p)}
    listed = _tree_modules()
    assert not modules - listed, f"modules missing from the README's Layout tree: {sorted(modules - listed)}"
    gone = {name for name in listed if not (PACKAGE / name).is_file()}
    assert not gone, f"README Layout entries with no module: {sorted(gone)}"
