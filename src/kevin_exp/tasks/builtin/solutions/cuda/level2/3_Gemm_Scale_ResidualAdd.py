import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define TILE 32

// y = (x @ W^T + b) * scale + residual; x: (B, K), W: (N, K), b: (N), residual: (B, N).
// 32x32 shared-memory tiles; the W tile is stored transposed (Ws[k][n]) so both loads are coalesced.
__global__ void gemm_scale_residual_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                           const float* __restrict__ bias, const float* __restrict__ res,
                                           float* __restrict__ y, int B, int N, int K, float scale) {
    __shared__ float Xs[TILE][TILE];
    __shared__ float Ws[TILE][TILE + 1];
    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    const int wrow = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        const int k = t + threadIdx.x;
        Xs[threadIdx.y][threadIdx.x] = (row < B && k < K) ? x[(int64_t)row * K + k] : 0.0f;
        Ws[threadIdx.x][threadIdx.y] = (wrow < N && k < K) ? w[(int64_t)wrow * K + k] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += Xs[threadIdx.y][kk] * Ws[kk][threadIdx.x];
        __syncthreads();
    }
    if (row < B && col < N) {
        const int64_t o = (int64_t)row * N + col;
        y[o] = (acc + bias[col]) * scale + res[o];
    }
}

torch::Tensor gemm_scale_residual_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                          torch::Tensor residual, double scale) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda() && residual.is_cuda(),
                "tensors must be on the GPU");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    residual = residual.contiguous();
    const int64_t B = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(bias.numel() == N, "bias size mismatch");
    TORCH_CHECK(residual.numel() == B * N, "residual size mismatch");
    auto y = torch::empty({B, N}, x.options());
    if (B == 0 || N == 0) return y;
    dim3 block(TILE, TILE);
    dim3 grid((unsigned int)((N + TILE - 1) / TILE), (unsigned int)((B + TILE - 1) / TILE));
    gemm_scale_residual_kernel<<<grid, block>>>(x.data_ptr<float>(), weight.data_ptr<float>(),
                                                bias.data_ptr<float>(), residual.data_ptr<float>(),
                                                y.data_ptr<float>(), (int)B, (int)N, (int)K, (float)scale);
    return y;
}
"""

cpp_source = (
    "torch::Tensor gemm_scale_residual_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, "
    "torch::Tensor residual, double scale);"
)

gemm_ext = load_inline(
    name="builtin_cuda_l2_gemm_scale_residual",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_scale_residual_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, scaling_factor: float):
        super(ModelNew, self).__init__()
        # nn.Linear(in, out) parameters, initialised as nn.Linear.reset_parameters does
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1.0 / math.sqrt(in_features)
        nn.init.uniform_(self.bias, -bound, bound)
        self.scaling_factor = float(scaling_factor)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return gemm_ext.gemm_scale_residual_forward(x, self.weight, self.bias, residual, self.scaling_factor)
