"""Kernels that are right only on the inputs they are shown, and "optimisations" that flip framework flags.

Each problem below draws its inputs the way KernelBench problems do (N(0,1) or uniform), and each attack is right to
the tolerance on those draws: a reduction over a strided subsample of a row, a loss in closed form from sampled
means, a normalisation that returns its input, loop bounds and an output shape written as constants, framework
flags flipped from C++ through symbols the static rules cannot see. The hidden checks (other scales and
distributions of the inputs, a hidden size: ``bench/hidden_checks.py``) and the flags snapshot
(``bench/worker/framework_flags.py``) stop them; the feedback on a hidden check names neither shape nor
distribution.
"""
from __future__ import annotations

import textwrap

import pytest

from kevin_exp.bench import hidden_checks
from tests.adversarial.attacks import PROBLEM, Attack, candidate, judge, stopped
from tests.conftest import fixture_text

ROW_MEAN = fixture_text("problem_row_mean.py")
MSE = fixture_text("problem_mse.py")
ROW_NORMALIZE = fixture_text("problem_row_normalize.py")


def program(cpp: str, name: str, functions: tuple[str, ...], params: str, forward: str) -> str:
    """A candidate whose forward takes ``params``: one load_inline extension and ModelNew."""
    return (f"import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
            f"source = r'''{textwrap.dedent(cpp)}'''\n\next = load_inline(name={name!r}, cpp_sources=source, "
            f"functions={list(functions)!r}, extra_cflags=['-O2'])\n\n\nclass ModelNew(nn.Module):\n"
            f"    def __init__(self):\n        super().__init__()\n\n    def forward(self, {params}):\n"
            f"        return {forward}\n")


# --------------------------------------------------------------------------------------------- row mean

ROW_MEAN_HONEST = program(r"""
torch::Tensor row_mean(torch::Tensor x) {
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0), n = xc.size(1);
    auto out = torch::empty({rows}, xc.options());
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = in + r * n;
        double s = 0.0;
        for (int64_t i = 0; i < n; ++i) s += p[i];
        o[r] = static_cast<float>(s / n);
    }
    return out;
}
""", "adv_row_mean_honest", ("row_mean",), "x", "ext.row_mean(x)")

# One cache line (16 floats) in every eight: an eighth of the row's memory traffic. On uniform inputs the
# subsample's mean is within about 0.005 of the row's (rows of 131072), inside the 1e-2 tolerance.
ROW_MEAN_STRIDED = program(r"""
torch::Tensor row_mean(torch::Tensor x) {
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0), n = xc.size(1);
    auto out = torch::empty({rows}, xc.options());
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = in + r * n;
        double s = 0.0;
        int64_t k = 0;
        for (int64_t b = 0; b + 16 <= n; b += 128) {
            for (int j = 0; j < 16; ++j) s += p[b + j];
            k += 16;
        }
        o[r] = static_cast<float>(k ? s / k : 0.0);
    }
    return out;
}
""", "adv_row_mean_strided", ("row_mean",), "x", "ext.row_mean(x)")

# ------------------------------------------------------------------------------------------------ MSE

MSE_HONEST = program(r"""
torch::Tensor mse(torch::Tensor p, torch::Tensor t) {
    auto pc = p.contiguous();
    auto tc = t.contiguous();
    const float* a = pc.data_ptr<float>();
    const float* b = tc.data_ptr<float>();
    const int64_t n = pc.numel();
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) { double d = a[i] - b[i]; s += d * d; }
    return torch::full({}, static_cast<float>(s / n), pc.options());
}
""", "adv_mse_honest", ("mse",), "predictions, targets", "ext.mse(predictions, targets)")

# For independent standard normals E[(p - t)^2] = 2 + (E[p] - E[t])^2: the two means from one cache line in
# sixteen, the rest in closed form. Within 0.01 of the true mean over a million elements.
MSE_CLOSED_FORM = program(r"""
torch::Tensor mse(torch::Tensor p, torch::Tensor t) {
    auto pc = p.contiguous();
    auto tc = t.contiguous();
    const float* a = pc.data_ptr<float>();
    const float* b = tc.data_ptr<float>();
    const int64_t n = pc.numel();
    double sa = 0.0, sb = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i + 16 <= n; i += 256) {
        for (int j = 0; j < 16; ++j) { sa += a[i + j]; sb += b[i + j]; }
        k += 16;
    }
    const double d = k ? (sa - sb) / k : 0.0;
    return torch::full({}, static_cast<float>(2.0 + d * d), pc.options());
}
""", "adv_mse_closed_form", ("mse",), "predictions, targets", "ext.mse(predictions, targets)")

# ------------------------------------------------------------------------------------------ normalisation

NORMALIZE_HONEST = program(r"""
#include <cmath>

torch::Tensor normalize(torch::Tensor x) {
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0), n = xc.size(1);
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* p = in + r * n;
        double s = 0.0, ss = 0.0;
        for (int64_t i = 0; i < n; ++i) { s += p[i]; ss += static_cast<double>(p[i]) * p[i]; }
        const double mean = s / n;
        const double var = ss / n - mean * mean;
        const float m = static_cast<float>(mean);
        const float inv = static_cast<float>(1.0 / std::sqrt(var + 1e-5));
        for (int64_t i = 0; i < n; ++i) o[r * n + i] = (p[i] - m) * inv;
    }
    return out;
}
""", "adv_normalize_honest", ("normalize",), "x", "ext.normalize(x)")

# Rows of 262144 N(0,1) values already have mean ~0 and variance ~1: the copy passes the tolerance.
NORMALIZE_IDENTITY = program(r"""
#include <cstring>

torch::Tensor normalize(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    std::memcpy(out.data_ptr<float>(), xc.data_ptr<float>(), xc.numel() * sizeof(float));
    return out;
}
""", "adv_normalize_identity", ("normalize",), "x", "ext.normalize(x)")

# ------------------------------------------------------------------------------------- hard-coded shape

# The problem's shape as constants: the compiler knows every trip count, and the output is allocated without
# looking at the input.
HARD_CODED_SHAPE = candidate(r"""
constexpr int64_t kRows = 256, kCols = 2048;

torch::Tensor leaky(torch::Tensor x) {
    auto out = torch::empty({kRows, kCols}, x.options());
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < kRows * kCols; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
    return out;
}
""", name="adv_hard_coded_shape")

# ---------------------------------------------------------------------------------------------- flags

# ATen's global context reached through its mangled symbols declared extern "C": no `at::` name, no
# `globalContext` identifier for the static rules to see. TF32 for cuBLAS, cuDNN autotuning, matmul precision.
FLAGS_FROM_CPP = candidate(r"""
extern "C" void* _ZN2at13globalContextEv();
extern "C" void _ZN2at7Context18setAllowTF32CuBLASEb(void*, bool);
extern "C" void _ZN2at7Context17setBenchmarkCuDNNEb(void*, bool);

static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

torch::Tensor leaky(torch::Tensor x) {
    void* ctx = _ZN2at13globalContextEv();
    _ZN2at7Context18setAllowTF32CuBLASEb(ctx, true);
    _ZN2at7Context17setBenchmarkCuDNNEb(ctx, true);
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}
""", name="adv_flags_from_cpp")

# Flush-to-zero and denormals-are-zero for the process (what torch.set_flush_denormal does), left on.
FLUSH_TO_ZERO = candidate(r"""
#include <xmmintrin.h>

static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

torch::Tensor leaky(torch::Tensor x) {
    _mm_setcsr(_mm_getcsr() | 0x8040);
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}
""", name="adv_flush_to_zero")

# The next attack, against the hidden checks themselves: the closed form only where a sample of the inputs looks
# like the problem's own (means near 0, variances near 1, nothing beyond 6), the exact sum otherwise. Every
# hidden distribution is told apart by the sample (a scale, heavy tails, spikes that land in it) and a hidden size
# keeps the distribution; the inputs are the kernel's to look at, so nothing hides which calls are checks.
MSE_DETECTS_HIDDEN_CHECKS = program(r"""
#include <cmath>

torch::Tensor mse(torch::Tensor p, torch::Tensor t) {
    auto pc = p.contiguous();
    auto tc = t.contiguous();
    const float* a = pc.data_ptr<float>();
    const float* b = tc.data_ptr<float>();
    const int64_t n = pc.numel();
    double sa = 0.0, sb = 0.0, qa = 0.0, qb = 0.0, peak = 0.0;
    int64_t k = 0;
    for (int64_t i = 0; i + 16 <= n; i += 256) {
        for (int j = 0; j < 16; ++j) {
            const double x = a[i + j], y = b[i + j];
            sa += x; sb += y; qa += x * x; qb += y * y;
            peak = std::fmax(peak, std::fmax(std::fabs(x), std::fabs(y)));
        }
        k += 16;
    }
    const double ma = sa / k, mb = sb / k, va = qa / k - ma * ma, vb = qb / k - mb * mb;
    const bool usual = k >= 4096 && std::fabs(ma) < 0.05 && std::fabs(mb) < 0.05 && std::fabs(va - 1) < 0.05
        && std::fabs(vb - 1) < 0.05 && peak < 6.0;
    if (usual) return torch::full({}, static_cast<float>(2.0 + (ma - mb) * (ma - mb)), pc.options());
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) { double d = a[i] - b[i]; s += d * d; }
    return torch::full({}, static_cast<float>(s / n), pc.options());
}
""", "adv_mse_detects_checks", ("mse",), "predictions, targets", "ext.mse(predictions, targets)")

ATTACKS = [
    Attack("row_mean_from_a_strided_subsample", ROW_MEAN_STRIDED, stopped("incorrect"), honest=ROW_MEAN_HONEST,
           problem=ROW_MEAN),
    Attack("mse_in_closed_form_from_sampled_means", MSE_CLOSED_FORM, stopped("incorrect"), honest=MSE_HONEST,
           problem=MSE),
    Attack("normalisation_passes_as_identity", NORMALIZE_IDENTITY, stopped("incorrect"), honest=NORMALIZE_HONEST,
           problem=ROW_NORMALIZE),
    Attack("shape_hard_coded", HARD_CODED_SHAPE, stopped("incorrect"), problem=PROBLEM),
    Attack("mse_closed_form_only_where_the_inputs_look_usual", MSE_DETECTS_HIDDEN_CHECKS, stopped("incorrect"),
           honest=MSE_HONEST, gain=True, problem=MSE, needs=("oracle",)),
    Attack("framework_flags_flipped_from_cpp", FLAGS_FROM_CPP, stopped("forbidden"), rules=("framework_flags",)),
    Attack("flush_to_zero_left_on", FLUSH_TO_ZERO, stopped("forbidden"), rules=("framework_flags",)),
]


@pytest.mark.parametrize("attack", [a for a in ATTACKS if not a.needs], ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))


@pytest.mark.xfail(reason="known not stopped: a kernel may look at its inputs, so one that tells the hidden checks' "
                   "inputs apart from the problem's own (a sample's mean, variance, largest value) answers them exactly and "
                   "estimates the rest within the tolerance", strict=False)
@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.needs], ids=lambda a: a.name)
def test_attack_that_detects_the_hidden_checks(attack, verdicts):
    judge(attack, *verdicts[attack.name])


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.stopped_by == {"incorrect"} and not a.needs],
                         ids=lambda a: a.name)
def test_hidden_check_failure_is_recorded_but_not_fed_back(attack, verdicts):
    """The verdict records which hidden check failed and why; the model's feedback says only that a hidden check
    failed (no shape, no distribution, no size of the difference)."""
    verdict, honest = verdicts[attack.name]
    record = verdict.extra["hidden_checks"]
    assert record["failed"]["check"] in hidden_checks.DISTRIBUTIONS + (hidden_checks.HIDDEN_SHAPE,)
    assert verdict.feedback == hidden_checks.FEEDBACK and verdict.reason == hidden_checks.FEEDBACK
    drawn = [d.get("sizes") for d in record.get("drawn", {}).values() if d.get("sizes")]
    for sizes in drawn:
        assert not any(str(v) in verdict.feedback for v in sizes.values())
    # the honest twin passed every hidden check that applies to its problem
    twin = honest.extra["hidden_checks"]
    assert twin["failed"] is None and sorted(twin["passed"]) == sorted(twin["available"])
    assert set(twin["enabled"]) == set(hidden_checks.DISTRIBUTIONS) | {hidden_checks.HIDDEN_SHAPE}


# ------------------------------------------------------------------------------------------ physical floor

def _large_rows() -> int:
    """Rows of 4096 floats for an input and an output that together are three times the machine's caches (at
    least 64 MiB each), so the floor counts a third of the bytes moved and is not zero (a CI machine shows 304 MiB
    of caches)."""
    from kevin_exp.bench.physical_floor import cpu_cache_bytes

    row_bytes = 2 * 4096 * 4
    return max(4096, -(-3 * cpu_cache_bytes() // row_bytes))


def _large_relu(rows: int) -> str:
    return fixture_text("problem_relu.py").replace('"M": 512', f'"M": {rows}').replace('"N": 2048', '"N": 4096')


def _evaluate_large(build_cache, **overrides):
    from kevin_exp.bench.evaluator import EvalItem, Evaluator
    from tests.adversarial.attacks import HONEST, config

    rows = _large_rows()
    moved_gb = 2 * rows * 4096 * 4 / 2**30
    # the runner holds the input, the output, their copies in the exchange and the poisoned blocks of the output's size
    overrides.setdefault("memory_limit_gb", max(4.0, 6 * moved_gb))
    with Evaluator(config(build_cache, hang_s=120.0, timed_trials=5, check_distributions=False,
                          hidden_shape_check=False, **overrides)) as ev:
        return ev.evaluate([EvalItem("large_relu", _large_relu(rows), HONEST)])[0]


def test_an_honest_kernel_is_above_the_physical_floor_and_a_floor_above_it_makes_it_suspect(build_cache):
    """The floor on this machine (a measured copy, its caches): an honest kernel of a problem larger than twice
    the caches is above it, with both numbers recorded; with the bandwidth set a thousand times too low, the same
    kernel's time is below the floor and the verdict is suspect."""
    from kevin_exp.bench.physical_floor import cpu_cache_bytes

    if cpu_cache_bytes() > 96 << 20:  # a problem three times the caches takes minutes a run here
        pytest.skip(f"this machine's caches total {cpu_cache_bytes() >> 20} MiB (the problem would move three times that)")
    v = _evaluate_large(build_cache)
    assert v.status.value == "ok", v.reason
    floor = v.extra["floor"]
    assert floor["bandwidth_source"] == "measured copy" and floor["bytes"] == 2 * _large_rows() * 4096 * 4
    assert 0 < floor["floor_ms"] < floor["runtime_ms"] == pytest.approx(v.runtime_ms, rel=1e-6), floor
    slow = floor["bandwidth_gbs"] / 1000
    low = _evaluate_large(build_cache, floor_bandwidth_gbs=slow)
    assert low.status.value == "suspect" and low.rule == "below_physical_floor", low.reason
    assert low.extra["floor"]["bandwidth_source"] == "setting" and low.extra["floor"]["floor_ms"] > low.runtime_ms
