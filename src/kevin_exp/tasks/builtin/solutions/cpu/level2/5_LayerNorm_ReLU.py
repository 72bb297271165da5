import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

// y = relu(layernorm(x) * weight + bias) over the last dimension (eps = 1e-5).
torch::Tensor layernorm_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t D = x.size(x.dim() - 1);
    TORCH_CHECK(weight.numel() == D && bias.numel() == D, "weight/bias must have the normalized size");
    auto out = torch::empty_like(x);
    const int64_t rows = D > 0 ? x.numel() / D : 0;
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const float* b = bias.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const float eps = 1e-5f;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = in + r * D;
        float* yr = o + r * D;
        double s = 0.0;
        for (int64_t j = 0; j < D; ++j) s += xr[j];
        const float mean = (float)(s / D);
        double v = 0.0;
        for (int64_t j = 0; j < D; ++j) {
            const float d = xr[j] - mean;
            v += (double)d * d;
        }
        const float rstd = 1.0f / std::sqrt((float)(v / D) + eps);
        for (int64_t j = 0; j < D; ++j) {
            const float y = (xr[j] - mean) * rstd * w[j] + b[j];
            yr[j] = y > 0.f ? y : 0.f;
        }
    }
    return out;
}
"""

layernorm_ext = load_inline(
    name="builtin_cpu_l2_layernorm_relu",
    cpp_sources=cpp_source,
    functions=["layernorm_relu_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: int):
        super(ModelNew, self).__init__()
        # nn.LayerNorm initialises its affine parameters to ones and zeros
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_relu_forward(x, self.weight, self.bias)
