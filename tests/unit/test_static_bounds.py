"""The static checks cannot be stalled: every regular expression they use is linear on adversarial input,
inputs past the bounds are ``too_large``, a runaway check is stopped at the deadline (``check_deadline``),
and every honest solution and test fixture still passes."""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest

from kevin_exp.bench import native_source
from kevin_exp.bench.build import user_flags
from kevin_exp.bench.checks import check_candidate, deadline, native, python_reach
from kevin_exp.bench.checks.native import check_native
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

RULES = CheckRules()
ROOT = Path(__file__).resolve().parents[2]
CANDIDATE = (ROOT / "tests/fixtures/cpu/ok.py").read_text()

# --------------------------------------------------------------------------- honest code still passes

# fixtures that exist to exercise a runtime defence: the switches their evaluator tests turn off, or the rule
# that must (alone) refuse them
FIXTURE_RULES = {
    "cpu/aten_compute.py": {"no_torch_compute": False, "no_native_library_compute": False},
    "cpu/python_tensor_method.py": {"no_torch_compute": False},
    "cpu/fork_bomb.py": {"no_concurrency": False},
    "cpu/orphan_child.py": {"no_concurrency": False},
    "cuda/side_stream.py": {"no_concurrency": False},
    # attacks on the evaluator's design, run with the rules that would refuse them off (test_evaluator_protocol.py)
    "cpu/import_marker.py": {"restrict_imports": False},
    # native code listing its own descriptors (test_fork_server.py): <dirent.h> and /proc are refused by the rules
    "cpu/list_descriptors.py": {"restrict_imports": False},
    "cpu/precompute_from_seed.py": {"no_timing_patch": False, "no_torch_compute": False, "restrict_imports": False},
    "cpu/slow_reference_patch.py": {"no_timing_patch": False, "no_torch_compute": False, "restrict_imports": False},
    "cpu/zero_inputs_in_runner.py": {"no_timing_patch": False},
}
FIXTURE_REFUSED = {"cpu/build_flag_wrapper.py": "build_flags"}
HONEST = sorted([*ROOT.glob("src/kevin_exp/tasks/builtin/solutions/*/*/*.py"), *ROOT.glob("tests/fixtures/c*/*.py")])


@pytest.mark.parametrize("path", HONEST, ids=[str(p.relative_to(ROOT)) for p in HONEST])
def test_every_builtin_solution_and_fixture_passes(path: Path) -> None:
    backend = "cuda" if "cuda" in path.parts else "cpu"
    key = "/".join(path.parts[-2:])
    rules = dataclasses.replace(RULES, **FIXTURE_RULES.get(key, {}))
    parsed, violations = check_candidate(path.read_text(), backend, rules)
    if key in FIXTURE_REFUSED:
        assert {v.rule for v in violations} == {FIXTURE_REFUSED[key]}
        return
    assert violations == [], violations
    assert parsed.specs and parsed.unresolved_calls == 0
    for spec in parsed.specs:  # the same specs checked on their own (as build_now does)
        assert check_native(spec, backend, rules) == []


# --------------------------------------------------------------------------- every regex is linear

def _patterns() -> list[tuple[str, re.Pattern[str]]]:
    found = []
    for module in (native, native_source, python_reach, user_flags):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                found.append((f"{module.__name__.rsplit('.', 1)[-1]}.{name}", value))
    found.append(("constant_folding digits", re.compile(r"\d+")))
    return found


PATTERNS = _patterns()
# runs of the characters the patterns' quantifiers match, unterminated literals and comments, deep nesting
SEEDS = ["a", " ", "\n", "\t", ".", ":", "::", "<", ">", "(", ")", "{", ";", "a(", "f(", ".a<", "->a<", "a::", "at::",
         "a ", "a\n", "#", "#define a ", "# include <", "\\", "\\\n", '"', "'", "/*", "//", 'R"x(', "u8R\"(", "-",
         "_", "__", "Py", "PyObject", "cublas", "DispatchKey", "1'", "0x1'", "std ::", "system ", "??", "%:", "$",
         "9", "a<b", "namespace a = ", "int 0x80 ", "-Wl,", "-O", "__a", "a_", "\\x", "\\1", "\\x1", "/", "/proc",
         "a/dev", "cuGraph", "cuda", "cu", "PFN_", "_open", "__libc_", "setAllow", "omp_set_", "cupti", "Ipc"]
SIZE = 60_000


@pytest.mark.parametrize(("name", "pattern"), PATTERNS, ids=[p[0] for p in PATTERNS])
def test_each_regex_is_linear_on_pathological_input(name: str, pattern: re.Pattern[str]) -> None:
    for seed in SEEDS:
        text = seed * (SIZE // len(seed)) + "!"
        start = time.perf_counter()
        for _ in pattern.finditer(text):
            pass
        pattern.match(text)
        pattern.fullmatch(text)
        elapsed = time.perf_counter() - start
        assert elapsed < 0.5, f"{name} took {elapsed:.2f}s on {seed!r} * {SIZE // len(seed)}"


def test_the_native_rules_are_linear_end_to_end() -> None:
    rules = dataclasses.replace(RULES, static_check_deadline_s=0)  # in this process: time the rules themselves
    for seed in ["f(", ".a<", "at::", "a'", '"', "/*", "#define a b\n", "(", "a ", "py::", "using namespace a;",
                 '"/p" ', '"\\x2f', "using namespace at;native::", "globalContext ", "using namespace at::"]:
        text = seed * (SIZE // len(seed))
        start = time.perf_counter()
        check_native(ExtensionSpec(name="e", cpp_sources=(text,), functions=("f",)), "cpu", rules)
        elapsed = time.perf_counter() - start
        assert elapsed < 0.9, f"check_native took {elapsed:.2f}s on {seed!r} * {SIZE // len(seed)}"


PYTHON_PATHOLOGICAL = {
    "long attribute chain": "y = " + "a." * 20_000 + "b\n",
    "long operator chain": "y = " + " + ".join(["'a'"] * 20_000) + "\n",
    "underscore string": "y = '" + "_" * 400_000 + "'\n",
    "dunder-like concatenation": "y = " + " + ".join(["'__'"] * 5_000) + "\n",
    "long f-string": "y = f'" + "{1}" * 3_000 + "'\n",  # (CPython parses long f-strings slowly)
    "many statements": "def f():\n" + "    x = 1\n" * 8_000,
    "many violations": "y = (" + ", ".join(["torch.matmul", "torch.sys", "[torch][0]"] * 1_000) + ")\n",
    "unterminated string": "y = '" + "a" * 300_000,
}


@pytest.mark.parametrize("name", list(PYTHON_PATHOLOGICAL))
def test_the_python_rules_finish_quickly_on_pathological_input(name: str) -> None:
    rules = dataclasses.replace(RULES, static_check_deadline_s=0)  # in this process: time the rules themselves
    start = time.perf_counter()
    try:
        check_candidate(CANDIDATE + PYTHON_PATHOLOGICAL[name], "cpu", rules)
    except (SyntaxError, RecursionError, MemoryError):
        pass  # the evaluator reports these as format errors
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"{name}: {elapsed:.2f}s"


# --------------------------------------------------------------------------- input bounds: too_large

def _only(violations, rule: str) -> str:
    assert [v.rule for v in violations] == [rule], violations
    return violations[0].message


def test_source_over_the_bound_is_too_large() -> None:
    parsed, violations = check_candidate(CANDIDATE, "cpu", dataclasses.replace(RULES, max_check_source_bytes=100))
    assert "max_check_source_bytes=100" in _only(violations, "too_large") and parsed.specs == []


def test_syntax_tree_over_the_bounds_is_too_large() -> None:
    assert "max_ast_nodes" in _only(check_candidate(CANDIDATE, "cpu", dataclasses.replace(RULES, max_ast_nodes=50))[1],
                                    "too_large")
    deep = CANDIDATE + "\ny = " + "-" * 150 + "1\n"
    assert "max_ast_depth" in _only(check_candidate(deep, "cpu", RULES)[1], "too_large")


@pytest.mark.parametrize("expansion", ['"x" * 1_000_000_000', '"ab" * 200_000', '"-".join(["abc"] * 4000) * 100'])
def test_folding_past_the_bound_is_too_large(expansion: str) -> None:
    src = CANDIDATE.replace("ext = load_inline(", f"big = {expansion}\next = load_inline(", 1).replace(
        "cpp_sources=source", "cpp_sources=source + big", 1)
    assert "cpp_sources=source + big" in src
    _only(check_candidate(src, "cpu", RULES)[1], "too_large")


def test_extension_over_the_bounds_is_too_large() -> None:
    many = ExtensionSpec(name="e", cpp_sources=("int f() { return 0; }",) * 40, functions=("f",))
    assert "max_extension_sources" in _only(check_native(many, "cpu", RULES), "too_large")
    big = ExtensionSpec(name="e", cpp_sources=("int f() { return 0; }\n" + " " * 300_000,), functions=("f",))
    assert "max_extension_bytes" in _only(check_native(big, "cpu", RULES), "too_large")
    assert check_native(big, "cpu", dataclasses.replace(RULES, max_extension_bytes=0)) == []


# --------------------------------------------------------------------------- the deadline

def test_a_runaway_check_is_stopped_at_the_deadline_and_the_next_one_runs() -> None:
    slow = ExtensionSpec(name="e", cpp_sources=("f(" * 4_000_000,), functions=("f",))
    rules = dataclasses.replace(RULES, static_check_deadline_s=1.0, max_extension_bytes=0)
    start = time.perf_counter()
    message = _only(check_native(slow, "cpu", rules), "check_deadline")
    assert time.perf_counter() - start < 8  # the check alone takes far longer: it was stopped
    assert "static_check_deadline_s" in message
    parsed, violations = check_candidate(CANDIDATE, "cpu", RULES)  # a fresh checker takes over
    assert violations == [] and len(parsed.specs) == 1


def test_checkers_are_reused_and_errors_come_back() -> None:
    check_candidate(CANDIDATE, "cpu", RULES)
    pids = {c.proc.pid for c in deadline._idle}
    check_candidate(CANDIDATE, "cpu", RULES)
    assert pids & {c.proc.pid for c in deadline._idle}
    with pytest.raises(SyntaxError):
        check_candidate("def f(:\n", "cpu", RULES)


def test_deadline_zero_checks_in_process() -> None:
    parsed, violations = check_candidate(CANDIDATE, "cpu", dataclasses.replace(RULES, static_check_deadline_s=0))
    assert violations == [] and len(parsed.specs) == 1
