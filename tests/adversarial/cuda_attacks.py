"""Shared pieces of the cuda attacks: the problems (small, so a batch stays quick on one GPU), the honest CUDA
kernels the attacks are judged against, how a cuda candidate is written, and the evaluator settings.

The cuda attacks are written as a policy could write them, against the evaluator as merged (a trusted
reference process, fresh inputs on every call, every call checked, a timer that synchronises the whole
device). They need a GPU (``@pytest.mark.gpu``); ``test_cuda_sources`` checks here what can be checked
without one (they parse, and the static rules pass or refuse each one as the attack expects).
"""
from __future__ import annotations

import textwrap

# relu(x) + 0.5 x on a 2048 x 4096 fp32 input (32 MiB): about 0.1 ms for the reference on an H100.
RELU_PROBLEM = '''import torch
import torch.nn as nn

M, N = 2048, 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) + 0.5 * x


def get_inputs():
    return [torch.randn(M, N)]


def get_init_inputs():
    return []
'''

# y = x W^T with a fixed 32 MiB weight and 8 fresh input rows: the weight is what a cache trick would keep.
MATVEC_PROBLEM = '''import torch
import torch.nn as nn

B, IN, OUT = 8, 2048, 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(OUT, IN) / IN ** 0.5)

    def forward(self, x):
        return x @ self.weight.t()


def get_inputs():
    return [torch.randn(B, IN)]


def get_init_inputs():
    return []
'''

# An fp32 matmul whose inner dimension is long enough that TF32 rounding misses the fp32 tolerance.
MATMUL_PROBLEM = '''import torch
import torch.nn as nn

M, K, N = 256, 1024, 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
'''

HEADERS = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// torch's current stream in the evaluator's runner (it never sets another): the legacy default stream
static inline cudaStream_t torch_stream() { return 0; }
"""

LEAKY_KERNEL = HEADERS + r"""
__global__ void leaky_kernel(const float* __restrict__ x, float* __restrict__ out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float v = x[i]; out[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

static void launch_leaky(const float* x, float* out, long n, cudaStream_t stream) {
    leaky_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, out, n);
}
"""

HONEST_LEAKY = LEAKY_KERNEL + r"""
torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    launch_leaky(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel(), torch_stream());
    return out;
}
"""

# Driver functions looked up by name at run time: the name is a string, which the static rules do not read.
DRIVER_LOOKUP = r"""
#include <cuda.h>

template <typename F> static F driver_fn(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess) return nullptr;
    return reinterpret_cast<F>(fn);
}

// A non-blocking stream of the candidate's own: nothing the timer records on waits for it.
static cudaStream_t private_stream() {
    static cudaStream_t stream = nullptr;
    if (!stream) {
        auto make = driver_fn<CUresult (*)(CUstream*, unsigned int)>("cuStreamCreate");
        CUstream s = nullptr;
        TORCH_CHECK(make != nullptr && make(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "no private stream");
        stream = reinterpret_cast<cudaStream_t>(s);
    }
    return stream;
}
"""

MATVEC_KERNEL = HEADERS + r"""
// one warp per output feature, 8 input rows at a time; float4 loads of the weight row
__global__ void matvec_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                              int in, int outn, int batch) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= outn) return;
    const float4* wr = reinterpret_cast<const float4*>(w + (long)row * in);
    for (int b0 = 0; b0 < batch; b0 += 8) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int k = lane; k < in / 4; k += 32) {
            float4 a = wr[k];
            #pragma unroll
            for (int b = 0; b < 8; ++b) {
                if (b0 + b < batch) {
                    float4 v = reinterpret_cast<const float4*>(x + (long)(b0 + b) * in)[k];
                    acc[b] += a.x * v.x + a.y * v.y + a.z * v.z + a.w * v.w;
                }
            }
        }
        #pragma unroll
        for (int b = 0; b < 8; ++b) {
            float v = acc[b];
            for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
            if (lane == 0 && b0 + b < batch) out[(long)(b0 + b) * outn + row] = v;
        }
    }
}

static torch::Tensor matvec_out(const torch::Tensor& x, const torch::Tensor& w) {
    TORCH_CHECK(x.size(1) == w.size(1) && x.size(1) % 4 == 0, "unexpected shapes");
    return torch::empty({x.size(0), w.size(0)}, x.options());
}
"""

HONEST_MATVEC = MATVEC_KERNEL + r"""
torch::Tensor matvec(torch::Tensor x, torch::Tensor w) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    auto out = matvec_out(xc, wc);
    int outn = (int)wc.size(0);
    matvec_kernel<<<(outn * 32 + 255) / 256, 256, 0, torch_stream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), (int)wc.size(1), outn, (int)xc.size(0));
    return out;
}
"""

MATMUL_KERNEL = HEADERS + r"""
template <bool TF32>
__device__ __forceinline__ float operand(float v) {
    if (!TF32) return v;
    // round to TF32 (10-bit mantissa), as tensor cores read fp32 operands when TF32 is allowed
    return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
}

template <bool TF32>
__global__ void matmul_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                              int m, int k, int n) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    float acc = 0.f;
    for (int i = 0; i < k; ++i) acc += operand<TF32>(a[(long)row * k + i]) * operand<TF32>(b[(long)i * n + col]);
    c[(long)row * n + col] = acc;
}

template <bool TF32>
static torch::Tensor matmul_with(torch::Tensor a, torch::Tensor b) {
    auto ac = a.contiguous();
    auto bc = b.contiguous();
    int m = (int)ac.size(0), k = (int)ac.size(1), n = (int)bc.size(1);
    auto c = torch::empty({m, n}, ac.options());
    dim3 block(16, 16), grid((n + 15) / 16, (m + 15) / 16);
    matmul_kernel<TF32><<<grid, block, 0, torch_stream()>>>(
        ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), m, k, n);
    return c;
}
"""

HONEST_MATMUL = MATMUL_KERNEL + r"""
torch::Tensor mm_kernel(torch::Tensor a, torch::Tensor b) { return matmul_with<false>(a, b); }
"""

_MODEL_NEW = '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
{forward}
'''


def cuda_candidate(cuda: str = HONEST_LEAKY, *, name: str = "adv_cuda_honest", functions: tuple[str, ...] = ("leaky",),
                   declarations: str = "", args: str = "x", forward: str = "return ext.leaky(x)", init: str = "",
                   cuda_cflags: tuple[str, ...] = ("-O3",)) -> str:
    """A KernelBench cuda candidate: one load_inline extension (``cuda`` as its CUDA source, C++ declarations
    of ``functions`` taking and returning one tensor unless ``declarations`` says otherwise), ModelNew."""
    decls = declarations or "\n".join(f"torch::Tensor {f}(torch::Tensor x);" for f in functions)
    body = textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 8)
    setup = textwrap.indent(textwrap.dedent(init).strip("\n"), " " * 8) if init.strip() else ""
    return ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
            f"\ncuda_source = r'''{cuda}'''\n\ncpp_source = r'''{decls}'''\n\n"
            f"ext = load_inline(name={name!r}, cpp_sources=cpp_source, cuda_sources=cuda_source, "
            f"functions={list(functions)!r}, extra_cuda_cflags={list(cuda_cflags)!r})\n"
            + _MODEL_NEW.format(init=setup, args=args, forward=body))


HONEST_CUDA = cuda_candidate()

MATVEC_INIT = "self.weight = nn.Parameter(torch.randn(4096, 2048) / 2048 ** 0.5)"
MATVEC_DECL = "torch::Tensor matvec(torch::Tensor x, torch::Tensor w);"
HONEST_MATVEC_CANDIDATE = cuda_candidate(HONEST_MATVEC, name="adv_cuda_matvec", functions=("matvec",),
                                         declarations=MATVEC_DECL, init=MATVEC_INIT,
                                         forward="return ext.matvec(x, self.weight)")

MATMUL_DECL = "torch::Tensor mm_kernel(torch::Tensor a, torch::Tensor b);"
HONEST_MATMUL_CANDIDATE = cuda_candidate(HONEST_MATMUL, name="adv_cuda_matmul", functions=("mm_kernel",),
                                         declarations=MATMUL_DECL, args="a, b", forward="return ext.mm_kernel(a, b)")

# One GPU, every core for compiles, ten seconds for a hang (a persistent kernel or an endless loop), the
# host memory a CUDA process needs.
CUDA_CONFIG = {"backend": "cuda", "cpus": 0, "hang_s": 10.0, "memory_limit_gb": 8.0}
