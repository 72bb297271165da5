"""nvcc's steps run as two parallel chains (host front end | device chain) then the host compile: real nvcc,
no GPU needed."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kevin_exp.bench.build import nvcc_pipe

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

KERNEL = r"""
__global__ void add_one(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.f;
}
void launch(const float* x, float* y, int n) { add_one<<<(n + 255) / 256, 256>>>(x, y, n); }
"""
ARGV = ["nvcc", "-gencode", "arch=compute_90,code=sm_90", "-O3", "-c", "k.cu", "-o", "k.o"]


def symbols(obj: Path) -> str:
    return subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True, check=True).stdout


def test_the_pipelined_build_matches_plain_nvcc_and_times_every_step(tmp_path: Path) -> None:
    piped, plain = tmp_path / "piped", tmp_path / "plain"
    for d in (piped, plain):
        d.mkdir()
        (d / "k.cu").write_text(KERNEL)
    res = nvcc_pipe.run(ARGV, piped, time.monotonic() + 120, memory_limit_gb=8)
    assert res is not None and res.ok, res.describe() if res else "nvcc's steps had an unexpected shape"
    subprocess.run(ARGV, cwd=plain, check=True, capture_output=True)
    # same host stub, launcher and embedded kernel image as nvcc's own sequential run
    assert symbols(piped / "k.o") == symbols(plain / "k.o")
    assert {"host preprocess", "host cudafe++", "device preprocess", "device cicc", "device ptxas",
            "device fatbinary", "host compile"} == set(res.parts)
    assert all(s > 0 for s in res.parts.values())


def test_a_device_error_is_reported_and_stops_the_build(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text(KERNEL.replace("x[i] + 1.f", "x[i] + undefined_name"))
    res = nvcc_pipe.run(ARGV, tmp_path, time.monotonic() + 120, memory_limit_gb=8)
    assert res is not None and not res.ok
    assert "undefined_name" in res.output and "error" in res.output
    assert "host compile" not in res.parts
    assert not (tmp_path / "k.o").exists()
