import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define THREADS 256

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the result.
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

// y = relu(layernorm(x) * w + b) over the last dimension; one block per row, two-pass statistics.
__global__ void layernorm_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ y,
                                      int64_t D, float eps) {
    __shared__ float shared[32];
    const float* xr = x + (int64_t)blockIdx.x * D;
    float* yr = y + (int64_t)blockIdx.x * D;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += xr[j];
    const float mean = block_sum(s, shared) / (float)D;
    float v = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        const float d = xr[j] - mean;
        v += d * d;
    }
    const float var = block_sum(v, shared) / (float)D;
    const float rstd = rsqrtf(var + eps);
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
        const float o = (xr[j] - mean) * rstd * w[j] + b[j];
        yr[j] = o > 0.0f ? o : 0.0f;
    }
}

torch::Tensor layernorm_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "tensors must be on the GPU");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t D = x.size(x.dim() - 1);
    TORCH_CHECK(weight.numel() == D && bias.numel() == D, "weight/bias must have the normalized size");
    auto y = torch::empty_like(x);
    const int64_t rows = D > 0 ? x.numel() / D : 0;
    if (rows == 0) return y;
    layernorm_relu_kernel<<<(unsigned int)rows, THREADS>>>(x.data_ptr<float>(), weight.data_ptr<float>(),
                                                           bias.data_ptr<float>(), y.data_ptr<float>(), D, 1e-5f);
    return y;
}
"""

cpp_source = "torch::Tensor layernorm_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

layernorm_ext = load_inline(
    name="builtin_cuda_l2_layernorm_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layernorm_relu_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: int):
        super(ModelNew, self).__init__()
        # nn.LayerNorm initialises its affine parameters to ones and zeros
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_relu_forward(x, self.weight, self.bias)
