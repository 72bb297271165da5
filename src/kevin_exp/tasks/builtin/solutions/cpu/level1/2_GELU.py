import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor gelu_forward(torch::Tensor x) {
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    const float inv_sqrt2 = 0.70710678118654752f;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        o[i] = 0.5f * v * (1.0f + std::erf(v * inv_sqrt2));
    }
    return out;
}
"""

gelu_ext = load_inline(
    name="builtin_cpu_l1_gelu",
    cpp_sources=cpp_source,
    functions=["gelu_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_ext.gelu_forward(x)
