"""The ATen op block also sees ops called from inside a C++ extension (they go through the
dispatcher), and records them even when the C++ code swallows the exception. Builds one small
extension with torch's load_inline (about 30-60 s on 2 cores)."""
from __future__ import annotations

import shutil

import pytest
import torch

from kevin_exp.bench.checks.native import check_native
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.runtime_guard import ForbiddenOpError, block_torch_compute
from kevin_exp.bench.spec import ExtensionSpec

SOURCE = r"""
#include <torch/extension.h>

torch::Tensor aten_matmul(torch::Tensor a, torch::Tensor b) {
    return at::matmul(a, b);
}

torch::Tensor swallowed_matmul(torch::Tensor a, torch::Tensor b) {
    try {
        return at::matmul(a, b);
    } catch (...) {
        return torch::zeros({a.size(0), b.size(1)}, a.options());
    }
}

torch::Tensor relu_loop(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
FUNCTIONS = ["aten_matmul", "swallowed_matmul", "relu_loop"]

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory):
    from torch.utils.cpp_extension import load_inline

    build_dir = tmp_path_factory.mktemp("guard_ext")
    return load_inline(name="kevin_guard_probe", cpp_sources=SOURCE, functions=FUNCTIONS,
                       extra_cflags=["-O1"], build_directory=str(build_dir))


def test_aten_call_inside_extension_is_blocked(ext) -> None:
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    assert ext.aten_matmul(a, b).shape == (4, 3)  # fine without the guard
    with pytest.raises(RuntimeError) as info:
        with block_torch_compute() as guard:
            ext.aten_matmul(a, b)
    assert guard.violations and guard.violations[0] == "mm"
    assert isinstance(info.value, ForbiddenOpError) or "mm" in str(info.value)


def test_swallowed_exception_in_cpp_is_still_recorded(ext) -> None:
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    with block_torch_compute() as guard:
        try:
            ext.swallowed_matmul(a, b)  # C++ catches the error and returns zeros
        except Exception:  # noqa: BLE001 - the Python error left set may resurface (SystemError)
            pass
    assert guard.first_violation == "mm"


def test_hand_written_loop_passes(ext) -> None:
    x = torch.randn(64)
    with block_torch_compute() as guard:
        out = ext.relu_loop(x)
    assert guard.violations == []
    assert torch.equal(out, torch.relu(x))


def test_static_check_flags_the_same_source() -> None:
    spec = ExtensionSpec(name="kevin_guard_probe", cpp_sources=(SOURCE,), functions=tuple(FUNCTIONS))
    rules = {v.rule for v in check_native(spec, "cpu", CheckRules())}
    assert rules == {"native_library_compute"}


# --------------------------------------------------------------------------- CUDA (GPU machine only)

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}

torch::Tensor relu_cuda(torch::Tensor x) {
    const at::cuda::OptionalCUDAGuard guard(device_of(x));
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    relu_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

torch::Tensor matmul_cuda(torch::Tensor a, torch::Tensor b) {
    return at::matmul(a, b);
}
"""
CUDA_DECLS = "torch::Tensor relu_cuda(torch::Tensor x);\ntorch::Tensor matmul_cuda(torch::Tensor a, torch::Tensor b);"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_extension_under_guard(tmp_path) -> None:
    from torch.utils.cpp_extension import load_inline

    ext = load_inline(name="kevin_guard_cuda_probe", cpp_sources=CUDA_DECLS, cuda_sources=CUDA_SOURCE,
                      functions=["relu_cuda", "matmul_cuda"], build_directory=str(tmp_path))
    x = torch.randn(1000, device="cuda")
    with block_torch_compute() as guard:
        y = ext.relu_cuda(x)
        torch.cuda.synchronize()
    assert guard.violations == [] and torch.equal(y, torch.relu(x))
    a, b = torch.randn(8, 4, device="cuda"), torch.randn(4, 2, device="cuda")
    with pytest.raises(RuntimeError):
        with block_torch_compute() as guard:
            ext.matmul_cuda(a, b)
    assert guard.first_violation == "mm"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["CUDA_RELU", "CUDA_LINEAR"])
def test_unit_test_cuda_candidates_build_and_pass_the_guard(name: str, tmp_path, monkeypatch) -> None:
    """The clean CUDA candidates of the unit tests are real, working code: static checks pass, they
    build, and forward runs under the guard with the right answer."""
    import importlib.util
    from pathlib import Path

    from kevin_exp.bench.checks import check_candidate

    path = Path(__file__).parents[1] / "unit" / "test_static_checks.py"
    spec = importlib.util.spec_from_file_location("_static_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    source = getattr(module, name)
    assert check_candidate(source, "cuda", CheckRules())[1] == []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    ns: dict = {"__name__": "candidate"}
    exec(compile(source, "candidate.py", "exec"), ns)
    torch.manual_seed(0)
    if name == "CUDA_RELU":
        model, x = ns["ModelNew"]().cuda(), torch.randn(64, 100, device="cuda")
        expected = torch.relu(x)
    else:
        model, x = ns["ModelNew"](32, 16).cuda(), torch.randn(8, 32, device="cuda")
        expected = torch.nn.functional.linear(x, model.weight, model.bias)
    with torch.no_grad(), block_torch_compute() as guard:
        out = model(x)
        torch.cuda.synchronize()
    assert guard.violations == []
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
