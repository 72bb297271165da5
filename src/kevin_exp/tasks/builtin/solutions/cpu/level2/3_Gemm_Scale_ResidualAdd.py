import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// y = (x @ W^T + b) * scale + residual; x: (B, K), W: (N, K), b: (N), residual: (B, N)
torch::Tensor gemm_scale_residual_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                          torch::Tensor residual, double scale) {
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    residual = residual.contiguous();
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
    const int64_t B = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(bias.numel() == N, "bias size mismatch");
    TORCH_CHECK(residual.numel() == B * N, "residual size mismatch");
    auto out = torch::empty({B, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    const float* rp = residual.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const float s_f = (float)scale;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * N; ++i) {
        const int64_t r = i / N, c = i % N;
        const float* xr = xp + r * K;
        const float* wr = wp + c * K;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            for (int u = 0; u < 8; ++u) acc[u] += xr[k + u] * wr[k + u];
        }
        float s = 0.f;
        for (; k < K; ++k) s += xr[k] * wr[k];
        for (int u = 0; u < 8; ++u) s += acc[u];
        op[i] = (s + bp[c]) * s_f + rp[i];
    }
    return out;
}
"""

gemm_ext = load_inline(
    name="builtin_cpu_l2_gemm_scale_residual",
    cpp_sources=cpp_source,
    functions=["gemm_scale_residual_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
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
