"""Cuda attacks on the evaluator's slot: a kernel that never ends, an illegal address (the CUDA context is
lost), writes far past the output into whatever lies next to it, the device reset under torch's feet, and
the GPU's memory taken at load time so the trusted reference process (on the same GPU) has none for its
expected outputs. Each must end in a verdict that scores nothing (or an honest one), and the honest kernel
evaluated next on the same slot must still be ``ok``: one evaluator, each fault followed by its twin."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from kevin_exp.bench.build.builder import BuildError
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.adversarial.attacks import Attack, config, judge, stopped
from tests.adversarial.cuda_attacks import CUDA_CONFIG, HONEST_CUDA, LEAKY_KERNEL, RELU_PROBLEM, cuda_candidate

pytestmark = pytest.mark.gpu

HANG = cuda_candidate(LEAKY_KERNEL + r"""
__device__ volatile int released = 0;  // nothing ever sets it

__global__ void spin_kernel(const float* x, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    while (!released) { }  // a volatile read per turn: the compiler must keep the loop
    if (i < n) out[i] = x[i];
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    spin_kernel<<<132, 256, 0, torch_stream()>>>(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}
""", name="adv_cuda_hang")

ILLEGAL_ADDRESS = cuda_candidate(LEAKY_KERNEL + r"""
__global__ void far_kernel(const float* x, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i + (1L << 40)] = x[i];
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel();
    far_kernel<<<(unsigned)((n + 255) / 256), 256, 0, torch_stream()>>>(xc.data_ptr<float>(),
                                                                                         out.data_ptr<float>(), n);
    return out;
}
""", name="adv_cuda_illegal")

# The right answer, then NaN over the 256 MiB after it (one write per 64-byte line): the allocator's next
# blocks (inputs, the harness's flush buffer) or unmapped addresses. The neighbour it would like to reach,
# the reference process, has its own address space.
WRITE_PAST_OUTPUT = cuda_candidate(LEAKY_KERNEL + r"""
__global__ void scribble_kernel(float* from, long lines) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < lines) from[i * 16] = __int_as_float(0x7fc00000);
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    long n = xc.numel(), lines = (256L << 20) / 64;
    cudaStream_t stream = torch_stream();
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), n, stream);
    scribble_kernel<<<(unsigned)((lines + 255) / 256), 256, 0, stream>>>(out.data_ptr<float>() + n, lines);
    return out;
}
""", name="adv_cuda_scribble")

# The answer, then the primary context torn down under torch: every later use of its memory fails.
DEVICE_RESET = cuda_candidate(LEAKY_KERNEL + r"""
static long calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    if (++calls == 2) cudaDeviceReset();
    return out;
}
""", name="adv_cuda_reset")

# At load time the candidate takes all but ~768 MiB of the GPU's free memory (cudaMalloc, 1 GiB at a time,
# never freed) and then computes honestly: the reference process on the same GPU prepares its expected
# outputs after the candidate has loaded, and standby runners start their CUDA contexts meanwhile.
MEMORY_HOG = cuda_candidate(LEAKY_KERNEL + r"""
#include <algorithm>
#include <vector>

static std::vector<void*> held;

torch::Tensor hog(torch::Tensor unused) {
    size_t free_bytes = 0, total = 0;
    while (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && free_bytes > (768ull << 20)) {
        size_t take = std::min<size_t>(1ull << 30, free_bytes - (768ull << 20));
        void* p = nullptr;
        if (cudaMalloc(&p, take) != cudaSuccess) { cudaGetLastError(); break; }
        held.push_back(p);
    }
    return unused;
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    return out;
}
""", name="adv_cuda_hog", functions=("hog", "leaky"), init="ext.hog(torch.zeros(1))")

FAULT = stopped("timeout", "runtime_error", "crashed", "incorrect")

ATTACKS = [
    Attack("kernel_never_ends", HANG, stopped("timeout"), honest=HONEST_CUDA, problem=RELU_PROBLEM),
    Attack("illegal_address_loses_the_context", ILLEGAL_ADDRESS, stopped("runtime_error", "crashed"),
           honest=HONEST_CUDA, problem=RELU_PROBLEM),
    Attack("write_256mib_past_the_output", WRITE_PAST_OUTPUT, FAULT, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM),
    # refused by the native rules now (cudaDeviceReset); a fault at run time is stopped too
    Attack("device_reset_under_torch", DEVICE_RESET, FAULT | stopped("forbidden"), honest=HONEST_CUDA, problem=RELU_PROBLEM),
    Attack("gpu_memory_taken_from_the_reference", MEMORY_HOG, FAULT, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM),
]


@pytest.fixture(scope="module")
def evaluator(build_cache):
    with Evaluator(config(build_cache, **CUDA_CONFIG)) as ev:
        prebuild(ev, [a.source for a in ATTACKS] + [HONEST_CUDA])
        yield ev


def prebuild(ev: Evaluator, sources: list[str]) -> None:
    """Every extension built up front, in parallel, into the build cache (the evaluations below run one at a
    time, and would compile one at a time); a build that fails is left for its evaluation to report."""
    specs = [spec for source in sources for spec in check_candidate(source, "cuda", CheckRules())[0].specs]

    def build(spec) -> None:
        try:
            ev.builder.build(spec)
        except BuildError:
            pass

    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        list(pool.map(build, specs))


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_fault_is_contained_and_the_slot_still_works(attack, evaluator):
    bad, good = attack.items()
    [verdict] = evaluator.evaluate([bad])
    [after] = evaluator.evaluate([EvalItem(f"{attack.name}:next", good.reference, good.candidate)])
    judge(attack, verdict, after)
    assert after.correct and after.max_abs_diff is not None and after.max_abs_diff < 1e-3, after.reason
