import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <vector>

#define TX 32
#define TY 8

// The input is viewed as (outer, R, inner); out[o][i] = sum_r x[o][r][i].
// Block (TX, TY): threadIdx.x walks `inner` (coalesced), threadIdx.y splits R.
// Grid (ceil(inner / TX), min(outer, 65535)); blocks loop over the remaining outer rows.
__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ out,
                               int64_t outer, int64_t R, int64_t inner) {
    __shared__ float partial[TY][TX];
    const int64_t i = (int64_t)blockIdx.x * TX + threadIdx.x;
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
        float acc = 0.0f;
        if (i < inner) {
            const float* base = x + o * R * inner + i;
            for (int64_t r = threadIdx.y; r < R; r += TY) acc += base[r * inner];
        }
        partial[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && i < inner) {
            float s = 0.0f;
            #pragma unroll
            for (int t = 0; t < TY; ++t) s += partial[t][threadIdx.x];
            out[o * inner + i] = s;
        }
        __syncthreads();  // partial is reused by the next outer row
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    x = x.contiguous();
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    const int64_t R = x.size(dim);
    std::vector<int64_t> out_sizes;
    for (int64_t d = 0; d < nd; ++d) out_sizes.push_back(d == dim ? 1 : x.size(d));
    auto out = torch::empty(out_sizes, x.options());
    if (outer == 0 || inner == 0) return out;
    dim3 block(TX, TY);
    dim3 grid((unsigned int)((inner + TX - 1) / TX), (unsigned int)(outer < 65535 ? outer : 65535));
    sum_dim_kernel<<<grid, block>>>(x.data_ptr<float>(), out.data_ptr<float>(), outer, R, inner);
    return out;
}
"""

cpp_source = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(
    name="builtin_cuda_l1_sum_dim",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sum_dim_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_forward(x, self.dim)
