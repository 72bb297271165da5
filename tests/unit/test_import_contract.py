"""The package's import contract, read from the source with ``ast`` (nothing is imported).

Every import counts, at any depth (inside functions and ``TYPE_CHECKING`` blocks too), relative ones resolved.
``from pkg import name`` is an import of ``pkg.name`` when that is a module, else of ``pkg``; importing
``a.b.c`` also runs the packages ``a.b`` on the way, so it counts as an import of them too, except of the
importer's own packages (they are running already).

- ``rl/`` imports nothing else of the package;
- ``bench/`` imports none of the run's side (``FORBIDDEN_FOR_BENCH``);
- ``analysis/`` imports neither ``run`` nor ``trainer``;
- no import cycle anywhere (imports inside functions included);
- no module under ``src/`` over ``MAX_MODULE_LINES`` lines, except those in ``KNOWN_LONG_MODULES``: each must
  still be there and over the limit, so one that is split must leave the list.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "kevin_exp"

FORBIDDEN_FOR_BENCH = ("rl", "rollout", "trainer", "run", "config", "records", "launch", "analysis")
MAX_TOP_LEVEL_MODULES = 8
MAX_MODULE_LINES = 450
# modules over the limit that are still to be split (paths relative to src/)
KNOWN_LONG_MODULES: set[str] = set()


@dataclass(frozen=True)
class Import:
    importer: str
    file: str  # the importer's file, relative to src/
    line: int
    imported: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.imported}"


def find_modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module under ``src/package``."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        if all(p.isidentifier() for p in parts):  # tasks' problem files (1_ReLU.py) are data, not modules
            modules[".".join(parts)] = (path, is_package)
    return modules


def _resolve(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _named(node: ast.AST, current_package: str, package: str) -> list[str]:
    """The dotted names an import statement asks for (``from pkg import x``: ``pkg.x``, decided later)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = current_package.split(".")
        base = base[: len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    if not (origin == package or origin.startswith(package + ".")):
        return []
    return [f"{origin}.{alias.name}" if alias.name != "*" else origin for alias in node.names]


def find_imports(src: Path, package: str) -> list[Import]:
    modules = find_modules(src, package)
    found = []
    for name, (path, is_package) in modules.items():
        own = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for asked in _named(node, own, package):
                if asked in modules:
                    target = asked
                elif isinstance(node, ast.ImportFrom):  # a name defined in the module it comes from
                    target = _resolve(asked.rpartition(".")[0], modules)
                else:
                    target = _resolve(asked, modules)
                if target is None or target == name:
                    continue
                file = str(path.relative_to(src))
                found.append(Import(name, file, node.lineno, target))
                parts = target.split(".")
                for i in range(2, len(parts)):  # the packages run on the way, other than the importer's own
                    ancestor = ".".join(parts[:i])
                    if ancestor != own and not own.startswith(ancestor + "."):
                        found.append(Import(name, file, node.lineno, ancestor))
    return found


def strongly_connected(edges: dict[str, list[Import]]) -> list[set[str]]:
    """Tarjan's groups of two or more modules that import one another (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted({i.imported for i in edges.get(root, [])})))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({i.imported for i in edges.get(child, [])}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def cycle_chain(group: set[str], edges: dict[str, list[Import]]) -> list[Import]:
    """One closed chain of imports through the group, from its first module back to it."""
    start = min(group)
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for imp in edges.get(node, []):
                if imp.imported == start:
                    return paths[node] + [imp]
                if imp.imported in group and imp.imported not in paths:
                    paths[imp.imported] = paths[node] + [imp]
                    nxt.append(imp.imported)
        frontier = nxt
    raise AssertionError(f"no chain closes through {sorted(group)}")


def _by_importer(imports: list[Import]) -> dict[str, list[Import]]:
    edges: dict[str, list[Import]] = {}
    for imp in imports:
        edges.setdefault(imp.importer, []).append(imp)
    return edges


def _within(name: str, part: str) -> bool:
    full = f"{PACKAGE}.{part}"
    return name == full or name.startswith(full + ".")


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return find_imports(SRC, PACKAGE)


def _report(bad: list[Import], rule: str) -> str:
    return f"{rule}:\n" + "\n".join(f"  {imp}" for imp in bad)


def test_rl_imports_nothing_else_of_the_package(imports):
    bad = [i for i in imports if _within(i.importer, "rl") and not _within(i.imported, "rl")]
    assert not bad, _report(bad, "rl/ is pure math and imports nothing else of kevin_exp")


def test_bench_imports_nothing_of_the_run(imports):
    bad = [i for i in imports if _within(i.importer, "bench") and any(_within(i.imported, p) for p in FORBIDDEN_FOR_BENCH)]
    assert not bad, _report(bad, f"bench/ imports none of {', '.join(FORBIDDEN_FOR_BENCH)}")


def test_analysis_imports_neither_the_run_nor_the_trainer(imports):
    bad = [i for i in imports if _within(i.importer, "analysis") and (_within(i.imported, "run") or _within(i.imported, "trainer"))]
    assert not bad, _report(bad, "analysis/ reads records; it imports neither run nor trainer")


def test_no_import_cycles(imports):
    edges = _by_importer(imports)
    groups = strongly_connected(edges)
    assert not groups, "import cycles:\n" + "\n".join(
        "  " + " -> ".join(str(i) for i in cycle_chain(g, edges)) for g in groups)


def test_the_top_level_holds_the_entry_points_and_a_few_base_modules():
    top = sorted(p.stem for p in (SRC / PACKAGE).glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules (at most {MAX_TOP_LEVEL_MODULES}): {top}"
    assert {"train", "evaluate", "show"} <= set(top)


def module_lengths(src: Path) -> dict[str, int]:
    """Lines of every module under ``src`` (path relative to it); tasks' problem files (1_ReLU.py) are data."""
    lengths = {}
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src)
        if all(p.isidentifier() for p in relative.with_suffix("").parts):
            lengths[str(relative)] = len(path.read_text().splitlines())
    return lengths


def test_no_module_is_over_the_line_limit():
    lengths = module_lengths(SRC)
    over = {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}
    unknown = sorted(set(over) - KNOWN_LONG_MODULES)
    assert not unknown, f"modules over {MAX_MODULE_LINES} lines (split them along their seams):\n" + "\n".join(
        f"  {name}: {over[name]} lines" for name in unknown)
    gone = sorted(KNOWN_LONG_MODULES - set(over))
    assert not gone, (f"no longer over {MAX_MODULE_LINES} lines (or gone): {gone}; remove them from "
                      "KNOWN_LONG_MODULES, so that they stay within the limit")


def test_the_line_count_reads_every_module_and_skips_data_files(tmp_path):
    pkg = tmp_path / "pk"
    (pkg / "tasks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (pkg / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (pkg / "tasks" / "1_Data.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert module_lengths(tmp_path) == {"pk/__init__.py": 0, "pk/long.py": MAX_MODULE_LINES + 1,
                                        "pk/short.py": MAX_MODULE_LINES}


def test_the_reader_resolves_relative_imports_nested_imports_and_packages(tmp_path):
    pkg = tmp_path / "pk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .leaf import x\n")
    (pkg / "sub" / "leaf.py").write_text("x = 1\n")
    (pkg / "base.py").write_text("def f():\n    from .sub import leaf\n    from . import other\n")
    (pkg / "other.py").write_text("import pk.sub.leaf\nfrom pk.sub import x\nfrom pk import base\n")
    found = {(i.importer, i.line, i.imported) for i in find_imports(tmp_path, "pk")}
    assert found == {
        ("pk.sub", 1, "pk.sub.leaf"),
        ("pk.base", 2, "pk.sub.leaf"), ("pk.base", 2, "pk.sub"), ("pk.base", 3, "pk.other"),
        ("pk.other", 1, "pk.sub.leaf"), ("pk.other", 1, "pk.sub"), ("pk.other", 2, "pk.sub"), ("pk.other", 3, "pk.base"),
    }
    edges = _by_importer(find_imports(tmp_path, "pk"))
    [group] = strongly_connected(edges)
    assert group == {"pk.base", "pk.other"}
    chain = cycle_chain(group, edges)
    assert [str(i) for i in chain] == ["pk/base.py:3 imports pk.other", "pk/other.py:3 imports pk.base"]
