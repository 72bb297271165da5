"""The ATen op guard sees ops a candidate's C++ runs on other threads (OpenMP, at::parallel_for): the op
watch (a global RecordFunction callback, built once into the build cache) records them."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import torch

from kevin_exp.bench import runtime_guard
from kevin_exp.bench.build import op_watch
from kevin_exp.bench.build.builder import Builder, import_extension
from kevin_exp.bench.runtime_guard import block_torch_compute
from kevin_exp.bench.spec import ExtensionSpec

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

at::Tensor mm_in_omp(at::Tensor a, at::Tensor b) {
  auto out = torch::zeros({a.size(0), b.size(1)}, a.options());
  #pragma omp parallel num_threads(2)
  {
    if (omp_get_thread_num() == 1) {
      auto part = at::mm(a, b);
      if (omp_get_thread_num() == 1) out.copy_(part);
    }
  }
  return out;
}

at::Tensor mm_in_parallel_for(at::Tensor a, at::Tensor b) {
  auto out = torch::zeros({a.size(0), b.size(1)}, a.options());
  at::parallel_for(0, a.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i].copy_(at::mm(a.narrow(0, i, 1), b)[0]);
  });
  return out;
}

at::Tensor loop_in_omp(at::Tensor x) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t n = xc.numel();
  #pragma omp parallel for num_threads(2)
  for (int64_t i = 0; i < n; ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
  return out;
}
"""
FUNCTIONS = ("mm_in_omp", "mm_in_parallel_for", "loop_in_omp")


@pytest.fixture(scope="module")
def ext(build_cache: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch_module):
    lib, what = op_watch.build(build_cache)
    assert lib is not None, what
    monkeypatch_module.setenv("KEVIN_EXP_CACHE", str(build_cache))
    runtime_guard._op_watch.cache_clear()
    spec = ExtensionSpec(name="omp_mm", cpp_sources=(SOURCE + f"// {uuid.uuid4().hex}\n",), functions=FUNCTIONS,
                         extra_cflags=("-fopenmp",), extra_ldflags=("-fopenmp",))
    return import_extension(Builder(build_cache).build(spec))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_mm_on_an_openmp_thread_is_caught(ext) -> None:
    a, b = torch.randn(8, 5), torch.randn(5, 3)
    torch.testing.assert_close(ext.mm_in_omp(a, b), a @ b)  # works without the guard
    with block_torch_compute() as guard:
        ext.mm_in_omp(a, b)
    assert guard.all_threads
    assert "mm" in guard.violations, guard.violations


def test_mm_in_parallel_for_is_caught(ext) -> None:
    torch.set_num_threads(2)
    a, b = torch.randn(64, 5), torch.randn(5, 3)
    with block_torch_compute() as guard:
        try:
            ext.mm_in_parallel_for(a, b)
        except RuntimeError:
            pass  # on the calling thread's share, the dispatch mode raises
    assert "mm" in guard.violations, guard.violations


def test_plain_loops_on_threads_pass(ext) -> None:
    x = torch.randn(4096)
    with block_torch_compute() as guard:
        out = ext.loop_in_omp(x)
    assert guard.all_threads and guard.violations == []
    assert torch.equal(out, torch.relu(x))


def test_torch_own_parallel_copies_pass(ext) -> None:
    torch.set_num_threads(2)
    x = torch.randn(1 << 20)
    with block_torch_compute() as guard:
        y = x.clone()
        y.copy_(x)
    assert guard.violations == []
