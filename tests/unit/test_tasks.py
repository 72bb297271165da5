"""kevin_exp.tasks: the built-in suite (problems and reference solutions) and the KernelBench loader."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kevin_exp.errors import UserError
from kevin_exp.tasks import BUILTIN_ROOT, Problem, UnknownProblemError, load_builtin, load_kernelbench, select

BUILTIN = load_builtin()
BACKENDS = ("cpu", "cuda")


def _exec(source: str, filename: str) -> dict:
    namespace: dict = {"__name__": filename.removesuffix(".py")}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def _init_params(tree: ast.Module, class_name: str) -> list[str]:
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    return [a.arg for a in init.args.args[1:]]


def _load_inline_calls(tree: ast.Module) -> list[ast.Call]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == "load_inline":
                calls.append(node)
    return calls


# --------------------------------------------------------------------------- the built-in suite


def test_builtin_suite_has_both_levels_sorted_with_unique_ids():
    assert len(BUILTIN) >= 14
    levels = {p.level for p in BUILTIN}
    assert levels == {1, 2}
    assert sum(p.level == 2 for p in BUILTIN) >= 4
    assert [(p.level, p.number) for p in BUILTIN] == sorted((p.level, p.number) for p in BUILTIN)
    assert len({p.problem_id for p in BUILTIN}) == len(BUILTIN)
    for p in BUILTIN:
        assert p.suite == "builtin"
        assert p.problem_id == f"builtin/level{p.level}/{p.number}"
        assert p.name == p.path.stem and p.name.startswith(f"{p.number}_")
        assert p.source == p.path.read_text()
    # numbered 1..k within each level, as KernelBench does
    for level in (1, 2):
        assert sorted(p.number for p in BUILTIN if p.level == level) == list(
            range(1, sum(p.level == level for p in BUILTIN) + 1))


def test_builtin_suite_covers_the_required_op_kinds():
    level1 = " ".join(p.name.lower() for p in BUILTIN if p.level == 1)
    for kind in ("relu", "sum", "softmax", "layernorm", "matmul", "conv2d", "pool", "l2norm"):
        assert kind in level1, kind
    level2 = [p.name.lower() for p in BUILTIN if p.level == 2]
    assert any("gemm" in n for n in level2) and any("conv" in n for n in level2)


def test_load_builtin_by_level_and_unknown_level():
    assert {p.level for p in load_builtin([2])} == {2}
    assert load_builtin([1, 2]) == BUILTIN
    with pytest.raises(FileNotFoundError, match="level 7"):
        load_builtin([7])


@pytest.mark.parametrize("problem", BUILTIN, ids=lambda p: p.problem_id)
def test_builtin_problem_runs_at_cpu_sizes(problem: Problem):
    ns = _exec(problem.source, problem.path.name)
    for name in ("Model", "get_inputs", "get_init_inputs", "BACKEND_SIZES"):
        assert name in ns, name
    sizes = ns["BACKEND_SIZES"]
    assert set(sizes) == {"cpu"}
    for key, value in sizes["cpu"].items():
        # every override names a module-level constant that get_inputs / get_init_inputs read at call time
        assert key in ns and isinstance(ns[key], int) and isinstance(value, int), key
        assert value <= ns[key], f"{key}: the cpu size should not exceed the cuda size"
    ns.update(sizes["cpu"])
    torch.manual_seed(42)
    init = ns["get_init_inputs"]()
    torch.manual_seed(42)
    model = ns["Model"](*init).eval()
    torch.manual_seed(0)
    inputs = ns["get_inputs"]()
    tensors = [t for t in inputs if torch.is_tensor(t)]
    assert tensors and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
    # cpu inputs stay well under glibc's 32 MiB mmap threshold (larger ones make page faults dominate timing)
    assert all(t.numel() <= 1 << 23 for t in tensors)
    with torch.no_grad():
        out = model(*inputs)
    assert torch.is_tensor(out) and out.dtype == torch.float32
    assert bool(torch.isfinite(out).all())
    # not degenerate at atol 1e-2: neither ~zero nor ~constant
    assert not torch.allclose(out, torch.zeros_like(out), atol=1e-2, rtol=0)
    off_median = (out - out.flatten().median()).abs() > 1e-2
    assert off_median.float().mean().item() > 0.02
    assert out.abs().max().item() > 0.1


@pytest.mark.parametrize("problem", BUILTIN, ids=lambda p: p.problem_id)
@pytest.mark.parametrize("backend", BACKENDS)
def test_builtin_solution_is_a_kernelbench_candidate(problem: Problem, backend: str):
    source = problem.solution(backend)
    assert source is not None, f"no {backend} solution for {problem.problem_id}"
    tree = ast.parse(source)
    assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    # same constructor signature as the reference Model
    assert _init_params(tree, "ModelNew") == _init_params(ast.parse(problem.source), "Model")
    calls = _load_inline_calls(tree)
    assert len(calls) == 1
    kwargs = {k.arg for k in calls[0].keywords}
    assert {"name", "cpp_sources", "functions"} <= kwargs
    for node in ast.walk(tree):
        assert not isinstance(node, (ast.Try, ast.Pass)), "solutions follow the candidate rules"
    if backend == "cuda":
        assert "cuda_sources" in kwargs and "__global__" in source and "<<<" in source
    else:
        assert "cuda_sources" not in kwargs and "__global__" not in source


def test_builtin_solution_extension_names_are_unique():
    names = []
    for problem in BUILTIN:
        for backend in BACKENDS:
            (call,) = _load_inline_calls(ast.parse(problem.solution(backend)))
            name = next(k.value for k in call.keywords if k.arg == "name")
            names.append(ast.literal_eval(name))
    assert len(set(names)) == len(names)


def test_tasks_package_imports_no_evaluator_and_no_hydra():
    code = ("import sys, kevin_exp.tasks as t; t.load_builtin(); "
            "bad = [m for m in sys.modules if m.startswith(('kevin_exp.bench', 'hydra', 'omegaconf'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- KernelBench checkouts


def _fake_checkout(root: Path) -> Path:
    problem = "import torch\nclass Model(torch.nn.Module):\n    pass\n"
    files = {
        "level1": ["1_Square_matrix_multiplication_.py", "10_ReLU.py", "2_Softmax.py"],
        "level2": ["3_Conv2d_ReLU.py", "1_Gemm_Add.py"],
        "level3": ["1_MLP.py"],
    }
    for level, names in files.items():
        folder = root / "KernelBench" / level
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_text(problem + f"# {name}\n")
        (folder / "__init__.py").write_text("")
        (folder / "README.md").write_text("not a problem")
    return root


def test_load_kernelbench_finds_problems_in_order(tmp_path):
    root = _fake_checkout(tmp_path)
    problems = load_kernelbench(root)
    assert [p.problem_id for p in problems] == [
        "kernelbench/level1/1", "kernelbench/level1/2", "kernelbench/level1/10",
        "kernelbench/level2/1", "kernelbench/level2/3",
    ]
    assert [(p.level, p.number) for p in problems] == [(1, 1), (1, 2), (1, 10), (2, 1), (2, 3)]
    first = problems[0]
    assert first.name == "1_Square_matrix_multiplication_" and first.suite == "kernelbench"
    assert first.path == root / "KernelBench" / "level1" / "1_Square_matrix_multiplication_.py"
    assert first.source.endswith("# 1_Square_matrix_multiplication_.py\n")
    assert first.solution("cpu") is None and first.solution("cuda") is None
    with pytest.raises(ValueError):
        first.solution("tpu")


def test_load_kernelbench_accepts_the_inner_folder_and_a_level_subset(tmp_path):
    root = _fake_checkout(tmp_path)
    inner = load_kernelbench(root / "KernelBench", levels=[2, 3])
    assert [p.problem_id for p in inner] == ["kernelbench/level2/1", "kernelbench/level2/3", "kernelbench/level3/1"]
    assert [p.problem_id for p in load_kernelbench(str(root), levels=(3,))] == ["kernelbench/level3/1"]


def test_load_kernelbench_missing_root_names_the_path(tmp_path):
    missing = tmp_path / "no_such_checkout"
    with pytest.raises(FileNotFoundError) as err:
        load_kernelbench(missing)
    message = str(err.value)
    assert str(missing) in message and "KernelBench checkout" in message and "\n" not in message


def test_load_kernelbench_missing_or_empty_level_names_the_folder(tmp_path):
    root = _fake_checkout(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        load_kernelbench(root, levels=(1, 4))
    assert str(root / "KernelBench" / "level4") in str(err.value)
    empty = root / "KernelBench" / "level5"
    empty.mkdir()
    (empty / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError) as err:
        load_kernelbench(root, levels=(5,))
    assert str(empty) in str(err.value)
    # a folder with no KernelBench layout at all
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_kernelbench(other)
    assert str(other / "KernelBench" / "level1") in str(err.value)


def test_load_kernelbench_rejects_duplicate_numbers(tmp_path):
    root = _fake_checkout(tmp_path)
    (root / "KernelBench" / "level1" / "2_Other.py").write_text("")
    with pytest.raises(ValueError, match="numbered 2"):
        load_kernelbench(root, levels=(1,))


# --------------------------------------------------------------------------- select


def test_select_keeps_the_order_given_and_drops_repeats():
    chosen = select(BUILTIN, ["builtin/level2/1", "builtin/level1/3", "builtin/level2/1"])
    assert [p.problem_id for p in chosen] == ["builtin/level2/1", "builtin/level1/3"]
    assert select(BUILTIN, []) == []


def test_select_unknown_id_is_a_clear_error():
    with pytest.raises(UnknownProblemError) as err:
        select(BUILTIN, ["builtin/level1/1", "builtin/level9/1", "level1/1"])
    message = str(err.value)
    assert "'builtin/level9/1'" in message and "'level1/1'" in message
    assert "builtin/level1/1," in message  # lists known ids
    assert isinstance(err.value, UserError)  # one line and exit 2 at every entry point


def test_builtin_root_layout():
    assert (BUILTIN_ROOT / "level1").is_dir()
    for backend in BACKENDS:
        for level in (1, 2):
            assert (BUILTIN_ROOT / "solutions" / backend / f"level{level}").is_dir()


# --------------------------------------------------------------------------- building the cpu solutions


@pytest.mark.slow
def test_every_builtin_cpu_solution_is_correct_under_the_evaluator(build_cache):
    """The cpu reference solutions build and match their references through the real evaluator (sandboxed
    workers, the shared compile cache), so the suite's solutions are always working kernels."""
    from kevin_exp.bench import BenchConfig, EvalItem, Evaluator, Status

    # correctness only: 3 timed trials are too few to judge a speedup, so no recheck (it would compare two noisy
    # timings and may call an honest kernel suspect on a busy machine)
    config = BenchConfig(backend="cpu", correctness_trials=2, warmup_trials=1, timed_trials=3, cache_dir=build_cache,
                         recheck_speedup=1e9)
    items = [EvalItem(p.problem_id, p.source, p.solution("cpu")) for p in BUILTIN]
    with Evaluator(config) as ev:
        verdicts = ev.evaluate(items)
    assert {v.problem_id: v.status for v in verdicts} == {p.problem_id: Status.OK for p in BUILTIN}, \
        {v.problem_id: v.reason for v in verdicts if v.status is not Status.OK}
