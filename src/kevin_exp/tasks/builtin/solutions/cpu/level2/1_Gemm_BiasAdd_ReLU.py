import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// y = relu(x @ W^T + bias); x: (B, K), W: (N, K) as stored by nn.Linear, bias: (N)
torch::Tensor gemm_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
    const int64_t B = x.size(0), K = x.size(1), N = weight.size(0);
    TORCH_CHECK(bias.numel() == N, "bias size mismatch");
    auto out = torch::empty({B, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* op = out.data_ptr<float>();
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
        const float v = s + bp[c];
        op[i] = v > 0.f ? v : 0.f;
    }
    return out;
}
"""

gemm_ext = load_inline(
    name="builtin_cpu_l2_gemm_bias_relu",
    cpp_sources=cpp_source,
    functions=["gemm_bias_relu_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
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
