import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Sum over `dim` with keepdim=True. The tensor is viewed as (outer, R, inner).
torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
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
    auto out = torch::zeros(out_sizes, x.options());
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < outer; ++b) {
        float* acc = o + b * inner;
        const float* src = in + b * R * inner;
        for (int64_t r = 0; r < R; ++r) {
            const float* row = src + r * inner;
            for (int64_t i = 0; i < inner; ++i) acc[i] += row[i];
        }
    }
    return out;
}
"""

sum_ext = load_inline(
    name="builtin_cpu_l1_sum_dim",
    cpp_sources=cpp_source,
    functions=["sum_dim_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_forward(x, self.dim)
