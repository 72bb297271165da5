"""Cuda attacks on the timing protocol and on the answers: work the timer's stream does not wait for (a
private stream obtained through the driver's entry points, a persistent kernel started at load time that
answers requests from a mailbox), answers kept by input pointer or content on the GPU, computing only on
the calls expected to be checked, expected outputs read from device memory found by walking the address
space, weights pinned in L2 across the cache flush (``cudaDeviceSetLimit`` + an access policy window), and
TF32 switched on from C++. One batch on one GPU, each attack judged against its honest twin."""
from __future__ import annotations

import pytest

from tests.adversarial.attacks import Attack, judge, stopped
from tests.adversarial.cuda_attacks import (
    CUDA_CONFIG,
    DRIVER_LOOKUP,
    HONEST_CUDA,
    HONEST_MATMUL_CANDIDATE,
    HONEST_MATVEC_CANDIDATE,
    LEAKY_KERNEL,
    MATMUL_DECL,
    MATMUL_KERNEL,
    MATMUL_PROBLEM,
    MATVEC_DECL,
    MATVEC_INIT,
    MATVEC_KERNEL,
    MATVEC_PROBLEM,
    RELU_PROBLEM,
    cuda_candidate,
)

pytestmark = pytest.mark.gpu

CONFIG = CUDA_CONFIG

# The kernel runs on a non-blocking stream of the candidate's own, made through cudaGetDriverEntryPointByVersion
# (the static rule sees neither cudaStreamCreate nor cuStreamCreate): forward returns before the kernel ends,
# and a timer that only waits for its own stream would stop at once.
PRIVATE_STREAM = cuda_candidate(LEAKY_KERNEL + DRIVER_LOOKUP + r"""
torch::Tensor leaky(torch::Tensor x) {
    static cudaEvent_t inputs_ready = nullptr;
    if (!inputs_ready) cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming);
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    cudaStream_t side = private_stream();
    // the private stream waits for the inputs; nothing on the timer's stream waits for the private stream
    cudaEventRecord(inputs_ready, torch_stream());
    cudaStreamWaitEvent(side, inputs_ready, 0);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), side);
    return out;
}
""", name="adv_cuda_private_stream")

# Started once from ModelNew's constructor on the private stream, the server kernel polls a mailbox in mapped
# host memory; forward posts (input, output, size) and returns: the answer is written a few microseconds later
# by a kernel that never ends. A timer that synchronises the device never returns.
PERSISTENT_SERVER = cuda_candidate(LEAKY_KERNEL + DRIVER_LOOKUP + r"""
#include <atomic>
#include <cstring>

struct Mailbox {
    volatile unsigned long long seq;
    const float* volatile x;
    float* volatile out;
    volatile long n;
};

__global__ void server_kernel(Mailbox* box) {
    __shared__ unsigned long long job;
    unsigned long long served = 0;
    while (true) {
        if (threadIdx.x == 0) {
            unsigned long long s;
            do { s = box->seq; } while (s == served);
            job = s;
        }
        __syncthreads();
        served = job;
        __threadfence_system();
        const float* x = box->x;
        float* out = box->out;
        long n = box->n;
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
            float v = x[i];
            out[i] = (v > 0.f ? v : 0.f) + 0.5f * v;
        }
        __syncthreads();
    }
}

static Mailbox* box = nullptr;

torch::Tensor start_server(torch::Tensor unused) {
    if (!box) {
        Mailbox* device_view = nullptr;
        TORCH_CHECK(cudaHostAlloc((void**)&box, sizeof(Mailbox), cudaHostAllocMapped) == cudaSuccess, "no mailbox");
        memset((void*)box, 0, sizeof(Mailbox));
        cudaHostGetDevicePointer((void**)&device_view, (void*)box, 0);
        server_kernel<<<64, 256, 0, private_stream()>>>(device_view);
    }
    return unused;
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    box->x = xc.data_ptr<float>();
    box->out = out.data_ptr<float>();
    box->n = xc.numel();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    box->seq = box->seq + 1;
    return out;
}
""", name="adv_cuda_persistent", functions=("start_server", "leaky"),
    init="ext.start_server(torch.zeros(1))")

# The calls the old protocol checked (correctness calls, every tenth timed call, the last ones) are computed;
# the others return the previous answer.
CHECKED_CALLS_ONLY = cuda_candidate(LEAKY_KERNEL + r"""
static long calls = 0;
static torch::Tensor last;

torch::Tensor leaky(torch::Tensor x) {
    const long trial = calls++ - 3;
    const bool checked = trial < 0 || trial % 10 == 0 || trial >= 10;
    if (!checked && last.defined()) return last;
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    last = out;
    return out;
}
""", name="adv_cuda_checked_only")

# The caching allocator hands each call's input the same address: the answer is kept by input pointer.
CACHE_BY_POINTER = cuda_candidate(LEAKY_KERNEL + r"""
#include <unordered_map>

static std::unordered_map<const void*, torch::Tensor> answers;

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto hit = answers.find(xc.data_ptr());
    if (hit != answers.end()) return hit->second;
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    answers[xc.data_ptr()] = out;
    return out;
}
""", name="adv_cuda_pointer_cache")

# A fingerprint of 64 input values, hashed on the GPU and read back (8 bytes): a repeated input costs one
# tiny kernel instead of the whole pass.
CACHE_BY_CONTENT = cuda_candidate(LEAKY_KERNEL + r"""
#include <unordered_map>

__global__ void fingerprint_kernel(const unsigned* bits, long n, unsigned long long* h) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long v = 1469598103934665603ull ^ (unsigned long long)n;
        for (long i = 0; i < n; i += n / 64 + 1) { v ^= bits[i]; v *= 1099511628211ull; }
        *h = v;
    }
}

static std::unordered_map<unsigned long long, torch::Tensor> answers;

torch::Tensor leaky(torch::Tensor x) {
    static unsigned long long* device_hash = nullptr;
    static unsigned long long* host_hash = nullptr;
    if (!device_hash) {
        cudaMalloc((void**)&device_hash, sizeof(unsigned long long));
        cudaHostAlloc((void**)&host_hash, sizeof(unsigned long long), cudaHostAllocDefault);
    }
    auto xc = x.contiguous();
    cudaStream_t stream = torch_stream();
    fingerprint_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<const unsigned*>(xc.data_ptr<float>()), xc.numel(), device_hash);
    cudaMemcpyAsync(host_hash, device_hash, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    auto hit = answers.find(*host_hash);
    if (hit != answers.end()) return hit->second;
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), stream);
    answers[*host_hash] = out;
    return out;
}
""", name="adv_cuda_content_cache")

# The expected output, wherever it lies in device memory this process can address: the first four answers
# are computed (cheap), then every mapped range within 8 GiB of the input (found with cuPointerGetAttribute,
# looked up by name) is searched for them, and the whole answer copied from where they are. A reference that
# ran in the candidate's process would leave its outputs there; guessed addresses of another process are not
# mapped here at all.
SCAN_DEVICE_MEMORY = cuda_candidate(LEAKY_KERNEL + DRIVER_LOOKUP + r"""
__global__ void expected_head(const float* x, float* want) {
    if (threadIdx.x < 4) { float v = x[threadIdx.x]; want[threadIdx.x] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

__global__ void find_head(const unsigned* region, long count, long n, const unsigned* want, unsigned long long* best) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i + n <= count; i += (long)gridDim.x * blockDim.x) {
        if (region + i == want) continue;
        if (region[i] == want[0] && region[i + 1] == want[1] && region[i + 2] == want[2] && region[i + 3] == want[3])
            atomicMin(best, (unsigned long long)(region + i));
    }
}

torch::Tensor leaky(torch::Tensor x) {
    static float* want = nullptr;
    static unsigned long long* best = nullptr;
    if (!want) { cudaMalloc((void**)&want, 4 * sizeof(float)); cudaMalloc((void**)&best, sizeof(unsigned long long)); }
    auto range = driver_fn<CUresult (*)(void*, CUpointer_attribute, CUdeviceptr)>("cuPointerGetAttribute");
    TORCH_CHECK(range != nullptr, "no pointer attributes");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const long n = xc.numel();
    cudaStream_t stream = torch_stream();
    expected_head<<<1, 32, 0, stream>>>(xc.data_ptr<float>(), want);
    cudaMemsetAsync(best, 0xff, sizeof(unsigned long long), stream);
    const CUdeviceptr step = 2ull << 20, span = 8ull << 30;
    const CUdeviceptr here = reinterpret_cast<CUdeviceptr>(xc.data_ptr<float>());
    CUdeviceptr probe = (here > span ? here - span : step) & ~(step - 1);
    while (probe < here + span) {
        CUdeviceptr base = 0;
        size_t size = 0;
        if (range(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, probe) == CUDA_SUCCESS &&
            range(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, probe) == CUDA_SUCCESS && size >= 4) {
            find_head<<<1024, 256, 0, stream>>>(reinterpret_cast<const unsigned*>(base), (long)(size / 4), n,
                                                reinterpret_cast<const unsigned*>(want), best);
            CUdeviceptr next = (base + size + step - 1) & ~(step - 1);
            probe = next > probe ? next : probe + step;
        } else {
            probe += step;
        }
    }
    unsigned long long found = ~0ull;
    cudaMemcpyAsync(&found, best, sizeof(found), cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    if (found != ~0ull)
        cudaMemcpyAsync(out.data_ptr<float>(), reinterpret_cast<const void*>(found), n * sizeof(float),
                        cudaMemcpyDeviceToDevice, stream);
    return out;  // not found: whatever the allocator left in it
}
""", name="adv_cuda_scan_memory")

# The weight stays in L2 across the harness's cache flush: the largest persisting carve-out the device allows
# (cudaDeviceSetLimit) and an access policy window over the weight on every launch (cudaLaunchKernelEx).
L2_PERSISTING_WEIGHT = cuda_candidate(MATVEC_KERNEL + r"""
#include <algorithm>

torch::Tensor matvec(torch::Tensor x, torch::Tensor w) {
    static size_t persisting = 0, max_window = 0;
    static bool configured = false;
    if (!configured) {
        int device = 0, carve = 0, window = 0;
        cudaGetDevice(&device);
        cudaDeviceGetAttribute(&carve, cudaDevAttrMaxPersistingL2CacheSize, device);
        cudaDeviceGetAttribute(&window, cudaDevAttrMaxAccessPolicyWindowSize, device);
        persisting = (size_t)carve;
        max_window = (size_t)window;
        cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, persisting);
        configured = true;
    }
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto out = matvec_out(xc, wc);
    int outn = (int)wc.size(0), in = (int)wc.size(1);
    size_t bytes = std::min((size_t)wc.numel() * sizeof(float), max_window);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeAccessPolicyWindow;
    attr[0].val.accessPolicyWindow.base_ptr = wc.data_ptr<float>();
    attr[0].val.accessPolicyWindow.num_bytes = bytes;
    attr[0].val.accessPolicyWindow.hitRatio = bytes ? std::min(1.0f, (float)persisting / (float)bytes) : 0.f;
    attr[0].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr[0].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((outn * 32 + 255) / 256);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = torch_stream();
    cfg.attrs = attr;
    cfg.numAttrs = bytes ? 1 : 0;
    const float* xp = xc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    float* op = out.data_ptr<float>();
    TORCH_CHECK(cudaLaunchKernelEx(&cfg, matvec_kernel, xp, wp, op, in, outn, (int)xc.size(0)) == cudaSuccess, "launch failed");
    return out;
}
""", name="adv_cuda_l2_persist", functions=("matvec",), declarations=MATVEC_DECL, init=MATVEC_INIT,
    forward="return ext.matvec(x, self.weight)")

# TF32 switched on from C++ (at::globalContext, reached unqualified after `using namespace at`) and the
# candidate's own kernel computing on TF32-rounded operands: passes only if the expected outputs are computed
# with TF32 too, i.e. if the switch reached the reference.
TF32_FROM_CPP = cuda_candidate(MATMUL_KERNEL + r"""
using namespace at;

torch::Tensor mm_kernel(torch::Tensor a, torch::Tensor b) {
    globalContext().setAllowTF32CuBLAS(true);
    return matmul_with<true>(a, b);
}
""", name="adv_cuda_tf32", functions=("mm_kernel",), declarations=MATMUL_DECL, args="a, b",
    forward="return ext.mm_kernel(a, b)")

# Native code rewrites the first bytes of cudaEventElapsedTime (the function torch's Event.elapsed_time ends in,
# loaded once per process) into a jump to its own function, which asks the driver for the true time and reports
# 40% of it. The page is made writable with pkey_mprotect (pkey -1: plain mprotect under a name the static rule
# does not list), else written through /proc/self/mem. The kernel is honest and every output right; only the
# timer lies, consistently, so a re-timing in a fresh runner agrees, and the parent's outside clock (which
# includes copying the inputs in) is far above either. It fails loudly (runtime_error) if the patch never ran.
REPORT_LESS_TIME = cuda_candidate(LEAKY_KERNEL + DRIVER_LOOKUP + r"""
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

extern "C" int pkey_mprotect(void* addr, size_t len, int prot, int pkey);

typedef CUresult (*elapsed_fn)(float*, CUevent, CUevent);
static elapsed_fn true_elapsed = nullptr;
static long reports = 0;

static cudaError_t reported_elapsed(float* ms, cudaEvent_t start, cudaEvent_t end) {
    CUresult r = true_elapsed(ms, reinterpret_cast<CUevent>(start), reinterpret_cast<CUevent>(end));
    if (r != CUDA_SUCCESS) return r == CUDA_ERROR_NOT_READY ? cudaErrorNotReady : cudaErrorUnknown;
    *ms *= 0.4f;
    ++reports;
    return cudaSuccess;
}

static bool overwrite(void* where, const unsigned char* code, size_t len) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    void* first = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(where) & ~(page - 1));
    if (pkey_mprotect(first, 2 * page, 7, -1) == 0) { memcpy(where, code, len); return true; }
    int fd = open("/proc/self/mem", O_RDWR);
    if (fd < 0) return false;
    bool done = pwrite(fd, code, len, (off_t)reinterpret_cast<uintptr_t>(where)) == (ssize_t)len;
    close(fd);
    return done;
}

torch::Tensor report_less(torch::Tensor unused) {
    true_elapsed = driver_fn<elapsed_fn>("cuEventElapsedTime");
    TORCH_CHECK(true_elapsed != nullptr, "no driver timer");
    unsigned char code[12] = {0x48, 0xB8};  // movabs rax, reported_elapsed; jmp rax
    uint64_t target = reinterpret_cast<uint64_t>(&reported_elapsed);
    memcpy(code + 2, &target, sizeof(target));
    code[10] = 0xFF;
    code[11] = 0xE0;
    TORCH_CHECK(overwrite(reinterpret_cast<void*>(&cudaEventElapsedTime), code, sizeof(code)), "patch refused");
    return unused;
}

static long calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    // calls 0-2 are untimed (2 correctness calls, 1 warm-up); by call 5 two timed calls have been reported
    TORCH_CHECK(++calls < 6 || reports > 0, "the timer never called the patched cudaEventElapsedTime");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    return out;
}
""", name="adv_cuda_report_less", functions=("report_less", "leaky"), init="ext.report_less(torch.zeros(1))")

SPEED = stopped("incorrect", "suspect", "forbidden", "runtime_error", "crashed")
# For attacks whose own machinery (a driver lookup, a launch attribute, a patch) raises when it fails: a
# runtime_error would say the attack did not work here, not that the evaluator stopped it, so it fails the test.
MACHINERY = stopped("incorrect", "suspect", "forbidden", "crashed")

ATTACKS = [
    Attack("kernel_on_private_stream_returns_before_it_ends", PRIVATE_STREAM, MACHINERY, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM),
    Attack("persistent_kernel_from_load_answers_a_mailbox", PERSISTENT_SERVER, stopped("timeout", *MACHINERY),
           honest=HONEST_CUDA, problem=RELU_PROBLEM),
    Attack("cuda_compute_only_on_checked_calls", CHECKED_CALLS_ONLY, SPEED, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM),
    Attack("cuda_cache_answers_by_input_pointer", CACHE_BY_POINTER, SPEED, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM),
    Attack("cuda_cache_answers_by_input_content", CACHE_BY_CONTENT, SPEED, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM),
    Attack("scan_device_memory_for_expected_output", SCAN_DEVICE_MEMORY, MACHINERY, honest=HONEST_CUDA,
           problem=RELU_PROBLEM),
    Attack("pin_weight_in_persisting_l2_across_flush", L2_PERSISTING_WEIGHT, MACHINERY, honest=HONEST_MATVEC_CANDIDATE,
           gain=True, problem=MATVEC_PROBLEM, needs=("oracle",)),
    Attack("patched_cuda_event_timer_reports_less", REPORT_LESS_TIME, MACHINERY, honest=HONEST_CUDA, gain=True,
           problem=RELU_PROBLEM, needs=("oracle",)),
    Attack("tf32_switched_on_from_cpp", TF32_FROM_CPP, stopped("incorrect", "forbidden"),
           honest=HONEST_MATMUL_CANDIDATE, problem=MATMUL_PROBLEM),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
