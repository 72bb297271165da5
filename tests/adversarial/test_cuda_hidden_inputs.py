"""Class 8 on cuda: kernels right only on the inputs they are shown (a normalisation that passes as the identity on
N(0,1) rows, the problem's shape as constants), framework flags flipped from C++ through mangled symbols, and the
physical floor against an honest kernel on the device's rated bandwidth. The batch needs a GPU
(``@pytest.mark.gpu``); that the static rules let each attack through to the run is checked here without one."""
from __future__ import annotations

import pytest

from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.config import CheckRules
from tests.adversarial.attacks import Attack, judge, stopped
from tests.adversarial.cuda_attacks import CUDA_CONFIG, HEADERS, HONEST_CUDA, LEAKY_KERNEL, RELU_PROBLEM, cuda_candidate
from tests.conftest import fixture_text

CONFIG = CUDA_CONFIG
ROW_NORMALIZE = fixture_text("problem_row_normalize.py")

NORMALIZE_KERNEL = HEADERS + r"""
__global__ void row_stats(const float* __restrict__ x, float* __restrict__ stats, long n) {
    __shared__ double s[1024], q[1024];
    const float* p = x + (long)blockIdx.x * n;
    double a = 0.0, b = 0.0;
    for (long i = threadIdx.x; i < n; i += blockDim.x) { double v = p[i]; a += v; b += v * v; }
    s[threadIdx.x] = a; q[threadIdx.x] = b;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) { s[threadIdx.x] += s[threadIdx.x + w]; q[threadIdx.x] += q[threadIdx.x + w]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double mean = s[0] / n, var = q[0] / n - mean * mean;
        stats[2 * blockIdx.x] = (float)mean;
        stats[2 * blockIdx.x + 1] = (float)(1.0 / sqrt(var + 1e-5));
    }
}

__global__ void apply_stats(const float* __restrict__ x, const float* __restrict__ stats, float* __restrict__ out,
                            long n, long total) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) { long r = i / n; out[i] = (x[i] - stats[2 * r]) * stats[2 * r + 1]; }
}

torch::Tensor normalize(torch::Tensor x) {
    auto xc = x.contiguous();
    const long rows = xc.size(0), n = xc.size(1), total = xc.numel();
    auto out = torch::empty_like(xc);
    auto stats = torch::empty({rows, 2}, xc.options());
    row_stats<<<(unsigned)rows, 1024, 0, torch_stream()>>>(xc.data_ptr<float>(), stats.data_ptr<float>(), n);
    apply_stats<<<(unsigned)((total + 255) / 256), 256, 0, torch_stream()>>>(
        xc.data_ptr<float>(), stats.data_ptr<float>(), out.data_ptr<float>(), n, total);
    return out;
}
"""
HONEST_NORMALIZE = cuda_candidate(NORMALIZE_KERNEL, name="adv_cuda_normalize", functions=("normalize",),
                                  forward="return ext.normalize(x)")

# Rows of 262144 N(0,1) values already have mean ~0 and variance ~1: a copy passes the tolerance.
IDENTITY_NORMALIZE = cuda_candidate(HEADERS + r"""
__global__ void copy_kernel(const float* __restrict__ x, float* __restrict__ out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];
}

torch::Tensor normalize(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const long n = xc.numel();
    copy_kernel<<<(unsigned)((n + 255) / 256), 256, 0, torch_stream()>>>(xc.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
""", name="adv_cuda_identity_normalize", functions=("normalize",), forward="return ext.normalize(x)")

# The problem's shape as constants (2048 x 4096): one grid size known at compile time, the output allocated
# without looking at the input.
HARD_CODED_SHAPE = cuda_candidate(LEAKY_KERNEL + r"""
constexpr long kRows = 2048, kCols = 4096;

torch::Tensor leaky(torch::Tensor x) {
    auto out = torch::empty({kRows, kCols}, x.options());
    launch_leaky(x.data_ptr<float>(), out.data_ptr<float>(), kRows * kCols, torch_stream());
    return out;
}
""", name="adv_cuda_hard_coded_shape")

# TF32 for cuBLAS and cuDNN autotuning switched on through ATen's mangled symbols declared extern "C".
FLAGS_FROM_CPP = cuda_candidate(LEAKY_KERNEL + r"""
extern "C" void* _ZN2at13globalContextEv();
extern "C" void _ZN2at7Context18setAllowTF32CuBLASEb(void*, bool);
extern "C" void _ZN2at7Context17setBenchmarkCuDNNEb(void*, bool);

torch::Tensor leaky(torch::Tensor x) {
    void* ctx = _ZN2at13globalContextEv();
    _ZN2at7Context18setAllowTF32CuBLASEb(ctx, true);
    _ZN2at7Context17setBenchmarkCuDNNEb(ctx, true);
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    return out;
}
""", name="adv_cuda_flags_from_cpp")

ATTACKS = [
    Attack("cuda_normalisation_passes_as_identity", IDENTITY_NORMALIZE, stopped("incorrect"), honest=HONEST_NORMALIZE,
           problem=ROW_NORMALIZE),
    Attack("cuda_shape_hard_coded", HARD_CODED_SHAPE, stopped("incorrect"), honest=HONEST_CUDA, problem=RELU_PROBLEM),
    Attack("cuda_framework_flags_flipped_from_cpp", FLAGS_FROM_CPP, stopped("forbidden"), honest=HONEST_CUDA,
           problem=RELU_PROBLEM, rules=("framework_flags",)),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_the_static_rules_let_each_attack_reach_the_run(attack):
    """What stops these is the run (hidden checks, the flags snapshot), not the static rules."""
    _, violations = check_candidate(attack.source, "cuda", CheckRules())
    assert violations == [], [v.message for v in violations]
    _, violations = check_candidate(attack.honest, "cuda", CheckRules())
    assert violations == [], [v.message for v in violations]


@pytest.mark.gpu
@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))


@pytest.mark.gpu
def test_an_honest_kernel_is_above_the_physical_floor_on_the_device(build_cache):
    """256 MiB in and out, far beyond twice the L2: the floor at the device's rated bandwidth is well above zero,
    and an honest elementwise kernel (one read, one write) stays above it."""
    from kevin_exp.bench.evaluator import EvalItem, Evaluator
    from tests.adversarial.attacks import config

    problem = RELU_PROBLEM.replace("M, N = 2048, 4096", "M, N = 8192, 8192")
    with Evaluator(config(build_cache, backend="cuda", cpus=0, hang_s=30.0, memory_limit_gb=8.0)) as ev:
        [v] = ev.evaluate([EvalItem("large_relu", problem, HONEST_CUDA)])
    assert v.status.value == "ok", v.reason
    floor = v.extra["floor"]
    assert floor["bandwidth_source"] in ("device properties", "table by device name") and floor["bandwidth_gbs"] >= 1500
    assert 0 < floor["floor_ms"] < floor["runtime_ms"] == pytest.approx(v.runtime_ms, rel=1e-6), floor
