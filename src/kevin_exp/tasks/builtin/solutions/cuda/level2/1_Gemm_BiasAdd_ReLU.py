import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define TILE 32

// y = relu(x @ W^T + bias); x: (B, K), W: (N, K) as stored by nn.Linear, bias: (N).
// 32x32 shared-memory tiles; the W tile is stored transposed (Ws[k][n]) so both loads are coalesced.
__global__ void gemm_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ y,
                                      int B, int N, int K) {
    __shared__ float Xs[TILE][TILE];
    __shared__ float Ws[TILE][TILE + 1];
    const int row = blockIdx.y * TILE + threadIdx.y;   // batch index
    const int col = blockIdx.x * TILE + threadIdx.x;   // output feature
    const int wrow = blockIdx.x * TILE + threadIdx.y;  // row of W this thread loads
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
        const float v = acc + bias[col];
        y[(int64_t)row * N + col] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor gemm_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "tensors must be on the GPU");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t B = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(bias.numel() == N, "bias size mismatch");
    auto y = torch::empty({B, N}, x.options());
    if (B == 0 || N == 0) return y;
    dim3 block(TILE, TILE);
    dim3 grid((unsigned int)((N + TILE - 1) / TILE), (unsigned int)((B + TILE - 1) / TILE));
    gemm_bias_relu_kernel<<<grid, block>>>(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                           y.data_ptr<float>(), (int)B, (int)N, (int)K);
    return y;
}
"""

cpp_source = "torch::Tensor gemm_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

gemm_ext = load_inline(
    name="builtin_cuda_l2_gemm_bias_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_bias_relu_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super(ModelNew, self).__init__()
        # nn.Linear(in, out, bias=False) weight, initialised as nn.Linear.reset_parameters does
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        # then the extra bias, drawn like torch.randn(bias_shape)
        self.bias = nn.Parameter(nn.init.normal_(torch.empty(bias_shape)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm_ext.gemm_bias_relu_forward(x, self.weight, self.bias)
