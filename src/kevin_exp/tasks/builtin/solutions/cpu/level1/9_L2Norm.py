import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

// x / ||x||_2 over dimension 1. The tensor is viewed as (outer, C, inner).
torch::Tensor l2norm_forward(torch::Tensor x) {
    x = x.contiguous();
    TORCH_CHECK(x.dim() >= 2, "expected at least 2 dimensions");
    const int64_t outer = x.size(0), C = x.size(1);
    int64_t inner = 1;
    for (int64_t d = 2; d < x.dim(); ++d) inner *= x.size(d);
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < outer; ++b) {
        const float* xb = in + b * C * inner;
        float* yb = o + b * C * inner;
        std::vector<float> ss(inner, 0.0f);
        for (int64_t c = 0; c < C; ++c) {
            const float* row = xb + c * inner;
            for (int64_t i = 0; i < inner; ++i) ss[i] += row[i] * row[i];
        }
        for (int64_t i = 0; i < inner; ++i) ss[i] = 1.0f / std::sqrt(ss[i]);
        for (int64_t c = 0; c < C; ++c) {
            const float* row = xb + c * inner;
            float* orow = yb + c * inner;
            for (int64_t i = 0; i < inner; ++i) orow[i] = row[i] * ss[i];
        }
    }
    return out;
}
"""

l2norm_ext = load_inline(
    name="builtin_cpu_l1_l2norm",
    cpp_sources=cpp_source,
    functions=["l2norm_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return l2norm_ext.l2norm_forward(x)
