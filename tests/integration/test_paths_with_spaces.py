"""A checkout, a Python installation or a compile cache whose path has a space in it builds and evaluates kernels
like any other (issue 32: torch's unquoted ldflags were split at the space, ``ld: cannot find .../my``, and every
kernel, the built-in solutions included, ended as an ``infra_error``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from kevin_exp.bench.build import nvcc_pipe
from kevin_exp.bench.build.flags import cuda_home, nvcc_path

ROOT = Path(__file__).resolve().parents[2]

_EVALUATE = r"""
import json, sys
from pathlib import Path

import torch
import kevin_exp
from kevin_exp.bench import BenchConfig
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.tasks.loader import load_builtin, select

[problem] = select(load_builtin([1]), ["builtin/level1/1"])
config = BenchConfig(backend="cpu", correctness_trials=2, warmup_trials=1, timed_trials=3, cpus=1, build_mode=sys.argv[2],
                     cache_dir=Path(sys.argv[1]), recheck_speedup=1e9, reference_max_spread=1e9,
                     reference_max_contention=1.0)
with Evaluator(config) as ev:
    [v] = ev.evaluate([EvalItem(problem.problem_id, problem.source, problem.solution("cpu"))])
print(json.dumps({"status": v.status.value, "correct": v.correct, "reason": v.reason, "feedback": v.feedback,
                  "torch": torch.__file__, "kevin_exp": kevin_exp.__file__, "python": sys.executable}))
"""


@pytest.mark.parametrize("build_mode", ["fast", "torch"])
def test_a_builtin_solution_builds_and_passes_with_spaces_in_every_path(tmp_path: Path, build_mode: str) -> None:
    """The interpreter (a venv), torch, the package's source and the compile cache all under paths with spaces;
    torch from a PYTHONPATH folder, whose headers and libraries the sandboxed compiler must see too. In both build
    modes: ``torch`` runs torch's own load_inline in a Python process inside the sandbox (which shows the venv by
    its real path, not by the link)."""
    venv = tmp_path / "my venv"
    venv.symlink_to(Path(sys.prefix), target_is_directory=True)
    python = venv / Path(sys.executable).relative_to(sys.prefix)
    site = tmp_path / "site with space"
    site.mkdir()
    (site / "torch").symlink_to(Path(torch.__file__).resolve().parent, target_is_directory=True)
    checkout = tmp_path / "my checkout"
    checkout.mkdir()
    (checkout / "src").symlink_to(ROOT / "src", target_is_directory=True)
    cache = tmp_path / "compile cache" / "kevin exp"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(checkout / "src")]),
           "KEVIN_EXP_CACHE": str(cache)}
    out = subprocess.run([str(python), "-c", _EVALUATE, str(cache), build_mode], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    # the paths with spaces were the ones used
    assert answer["torch"].startswith(str(site)) and answer["kevin_exp"].startswith(str(checkout)), answer
    assert answer["python"].startswith(str(venv)), answer
    assert answer["status"] == "ok" and answer["correct"], answer


@pytest.fixture
def spaced_cuda_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """CUDA_HOME is a link named with two spaces in a row to the real toolkit (the sandbox shows it to compilers)."""
    real = Path(cuda_home() or "/usr/local/cuda").resolve()
    if not (real / "bin" / "nvcc").exists() or not (real / "nvvm").is_dir():
        pytest.skip(f"no CUDA toolkit folder at {real}")
    home = tmp_path / "cuda  home"
    home.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.delenv("PYTORCH_NVCC", raising=False)
    cuda_home.cache_clear()
    yield home
    cuda_home.cache_clear()


def test_nvcc_s_steps_run_from_a_cuda_home_and_a_folder_with_spaces(tmp_path: Path, spaced_cuda_home: Path) -> None:
    """nvcc prints its paths unquoted in its environment block (PATH, CICC_PATH): two spaces in a row stay two."""
    work, include = tmp_path / "build dir", tmp_path / "build dir" / "my headers"
    include.mkdir(parents=True)
    (include / "one.h").write_text("#define ONE 1.f\n")
    (work / "k.cu").write_text('#include "one.h"\n__global__ void add_one(float* x) { x[threadIdx.x] += ONE; }\n')
    assert nvcc_path() == str(spaced_cuda_home / "bin" / "nvcc")
    argv = [nvcc_path(), f"-I{include}", "-gencode", "arch=compute_90,code=sm_90", "-c", "k.cu", "-o", "k.o"]
    res = nvcc_pipe.run(argv, work, time.monotonic() + 300, memory_limit_gb=8)
    assert res is not None, "nvcc's steps had an unexpected shape"
    assert res.ok, res.describe()
    assert "device cicc" in res.parts and (work / "k.o").stat().st_size > 0
