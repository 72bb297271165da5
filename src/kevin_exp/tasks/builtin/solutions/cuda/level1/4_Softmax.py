import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <math.h>

#define THREADS 256

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Reductions over the whole block (blockDim.x a multiple of 32); every thread gets the result.
__device__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) shared[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? shared[lane] : -INFINITY;
        t = warp_max(t);
        if (lane == 0) shared[0] = t;
    }
    __syncthreads();
    const float r = shared[0];
    __syncthreads();
    return r;
}

__device__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) shared[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? shared[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) shared[0] = t;
    }
    __syncthreads();
    const float r = shared[0];
    __syncthreads();
    return r;
}

// One block per row of length D.
__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t D) {
    __shared__ float shared[32];
    const float* xr = x + (int64_t)blockIdx.x * D;
    float* yr = y + (int64_t)blockIdx.x * D;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s, shared);
    const float inv = 1.0f / s;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t D = x.size(x.dim() - 1);
    const int64_t rows = D > 0 ? x.numel() / D : 0;
    if (rows == 0) return y;
    TORCH_CHECK(rows <= 2147483647LL, "too many rows");
    softmax_kernel<<<(unsigned int)rows, THREADS>>>(x.data_ptr<float>(), y.data_ptr<float>(), D);
    return y;
}
"""

cpp_source = "torch::Tensor softmax_forward(torch::Tensor x);"

softmax_ext = load_inline(
    name="builtin_cuda_l1_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_ext.softmax_forward(x)
