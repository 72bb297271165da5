import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// Inclusive prefix sum along `dim`. The tensor is viewed as (outer, R, inner).
torch::Tensor cumsum_forward(torch::Tensor x, int64_t dim) {
    x = x.contiguous();
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    const int64_t R = x.size(dim);
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < outer; ++b) {
        const float* src = in + b * R * inner;
        float* dst = o + b * R * inner;
        if (R == 0) continue;
        for (int64_t i = 0; i < inner; ++i) dst[i] = src[i];
        for (int64_t r = 1; r < R; ++r) {
            const float* row = src + r * inner;
            const float* prev = dst + (r - 1) * inner;
            float* cur = dst + r * inner;
            for (int64_t i = 0; i < inner; ++i) cur[i] = prev[i] + row[i];
        }
    }
    return out;
}
"""

cumsum_ext = load_inline(
    name="builtin_cpu_l1_cumsum",
    cpp_sources=cpp_source,
    functions=["cumsum_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cumsum_ext.cumsum_forward(x, self.dim)
