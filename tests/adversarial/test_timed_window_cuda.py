"""The cuda twins of ``test_timed_window``: a result written into the input on the calls the fixed schedule leaves
unchecked, and a transposed view whose densifying copy the harness used to make after the clock. On cuda the
runner copies the whole output and the inputs device -> page-locked host inside the parent's clock, then
synchronises the device. One batch on one GPU, each attack judged against its honest twin."""
from __future__ import annotations

import pytest

from tests.adversarial.attacks import Attack, judge, stopped
from tests.adversarial.cuda_attacks import CUDA_CONFIG, HONEST_CUDA, LEAKY_KERNEL, RELU_PROBLEM, cuda_candidate

pytestmark = pytest.mark.gpu

CONFIG = CUDA_CONFIG

IN_PLACE_BY_COUNT = cuda_candidate(LEAKY_KERNEL + r"""
__global__ void leaky_in_place(float* x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; x[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

static long calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    const long call = calls++;
    const long n = x.numel();
    if (call < 2 || call >= 15) {
        auto out = torch::empty_like(x);
        launch_leaky(x.data_ptr<float>(), out.data_ptr<float>(), n, torch_stream());
        return out;
    }
    leaky_in_place<<<(unsigned)((n + 255) / 256), 256, 0, torch_stream()>>>(x.data_ptr<float>(), n);
    return x;
}
""", name="adv_cuda_in_place_by_count")

TRANSPOSED_PROBLEM = RELU_PROBLEM.replace("return torch.relu(x) + 0.5 * x", "return (torch.relu(x) + 0.5 * x).t().contiguous()")
assert TRANSPOSED_PROBLEM != RELU_PROBLEM
ROW_MAJOR = LEAKY_KERNEL + r"""
torch::Tensor leaky(torch::Tensor x) {
    auto out = torch::empty_like(x);
    launch_leaky(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), torch_stream());
    return out.t();
}
"""
TRANSPOSED_VIEW = cuda_candidate(ROW_MAJOR, name="adv_cuda_transposed_view")
TRANSPOSED_HONEST = cuda_candidate(ROW_MAJOR, name="adv_cuda_transposed_view", forward="return ext.leaky(x).contiguous()")

ATTACKS = [
    Attack("cuda_in_place_into_input_on_unchecked_calls", IN_PLACE_BY_COUNT, stopped("incorrect"), honest=HONEST_CUDA,
           problem=RELU_PROBLEM),
    Attack("cuda_transposed_view_made_dense_by_the_harness", TRANSPOSED_VIEW,
           stopped("incorrect", "suspect", "forbidden", "runtime_error", "crashed"), honest=TRANSPOSED_HONEST,
           gain=True, problem=TRANSPOSED_PROBLEM),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
