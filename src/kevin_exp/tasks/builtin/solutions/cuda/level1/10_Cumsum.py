import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define SCAN_THREADS 1024

// Inclusive scan of contiguous rows (scan dimension is the last one): one block per row, the row is
// processed in tiles of blockDim.x elements; each tile is scanned with warp shuffles plus a scan of
// the warp totals, and a running carry links the tiles.
__global__ void cumsum_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t R) {
    __shared__ float warp_tot[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const float* xr = x + row * R;
        float* yr = y + row * R;
        float carry = 0.0f;
        for (int64_t base = 0; base < R; base += blockDim.x) {
            const int64_t j = base + threadIdx.x;
            float v = j < R ? xr[j] : 0.0f;
            #pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float t = __shfl_up_sync(0xffffffff, v, o);
                if (lane >= o) v += t;
            }
            if (lane == 31) warp_tot[wid] = v;
            __syncthreads();
            if (wid == 0) {
                float s = lane < nw ? warp_tot[lane] : 0.0f;
                #pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const float t = __shfl_up_sync(0xffffffff, s, o);
                    if (lane >= o) s += t;
                }
                if (lane < nw) warp_tot[lane] = s;  // inclusive scan of the warp totals
            }
            __syncthreads();
            const float prefix = wid > 0 ? warp_tot[wid - 1] : 0.0f;
            if (j < R) yr[j] = carry + prefix + v;
            carry += warp_tot[nw - 1];
            __syncthreads();  // warp_tot is rewritten by the next tile
        }
    }
}

// General case (scan dimension not the last): one thread per (outer, inner) line, sequential scan.
__global__ void cumsum_strided_kernel(const float* __restrict__ x, float* __restrict__ y,
                                      int64_t outer, int64_t R, int64_t inner) {
    const int64_t total = outer * inner;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        const int64_t b = idx / inner, i = idx % inner;
        const float* xp = x + b * R * inner + i;
        float* yp = y + b * R * inner + i;
        float s = 0.0f;
        for (int64_t r = 0; r < R; ++r) {
            s += xp[r * inner];
            yp[r * inner] = s;
        }
    }
}

torch::Tensor cumsum_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    x = x.contiguous();
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    const int64_t R = x.size(dim);
    auto y = torch::empty_like(x);
    if (x.numel() == 0) return y;
    if (inner == 1) {
        const int64_t blocks = outer < 1048576 ? outer : 1048576;
        cumsum_rows_kernel<<<(unsigned int)blocks, SCAN_THREADS>>>(x.data_ptr<float>(), y.data_ptr<float>(), outer, R);
    } else {
        const int threads = 256;
        int64_t blocks = (outer * inner + threads - 1) / threads;
        if (blocks > 1048576) blocks = 1048576;
        cumsum_strided_kernel<<<(unsigned int)blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                                                 outer, R, inner);
    }
    return y;
}
"""

cpp_source = "torch::Tensor cumsum_forward(torch::Tensor x, int64_t dim);"

cumsum_ext = load_inline(
    name="builtin_cuda_l1_cumsum",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["cumsum_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cumsum_ext.cumsum_forward(x, self.dim)
