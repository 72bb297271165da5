import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// y = relu(conv2d(x, W) + conv_bias) + bias; stride 1, no padding.
// x: (N, C, H, W), weight: (OC, C, KH, KW), conv_bias: (OC), bias: (OC, 1, 1)
torch::Tensor conv_relu_bias_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias,
                                     torch::Tensor bias) {
    x = x.contiguous();
    weight = weight.contiguous();
    conv_bias = conv_bias.contiguous();
    bias = bias.contiguous();
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "expected 4-D input and weight");
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
    TORCH_CHECK(weight.size(1) == C, "channel mismatch");
    TORCH_CHECK(conv_bias.numel() == OC && bias.numel() == OC, "bias size mismatch");
    const int64_t OH = H - KH + 1, OW = W - KW + 1;
    auto out = torch::empty({N, OC, OH, OW}, x.options());
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const float* cb = conv_bias.data_ptr<float>();
    const float* b2 = bias.data_ptr<float>();
    float* o = out.data_ptr<float>();
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < N * OC; ++p) {
        const int64_t n = p / OC, oc = p % OC;
        float* op = o + p * OH * OW;
        for (int64_t i = 0; i < OH * OW; ++i) op[i] = cb[oc];
        for (int64_t c = 0; c < C; ++c) {
            const float* ip = in + (n * C + c) * H * W;
            for (int64_t kh = 0; kh < KH; ++kh) {
                for (int64_t kw = 0; kw < KW; ++kw) {
                    const float wv = w[((oc * C + c) * KH + kh) * KW + kw];
                    for (int64_t oh = 0; oh < OH; ++oh) {
                        const float* irow = ip + (oh + kh) * W + kw;
                        float* orow = op + oh * OW;
                        for (int64_t ow = 0; ow < OW; ++ow) orow[ow] += wv * irow[ow];
                    }
                }
            }
        }
        const float bv = b2[oc];
        for (int64_t i = 0; i < OH * OW; ++i) op[i] = (op[i] > 0.f ? op[i] : 0.f) + bv;
    }
    return out;
}
"""

conv_ext = load_inline(
    name="builtin_cpu_l2_conv_relu_bias",
    cpp_sources=cpp_source,
    functions=["conv_relu_bias_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, bias_shape: tuple):
        super(ModelNew, self).__init__()
        # nn.Conv2d parameters, created and initialised as nn.Conv2d does
        self.conv_weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.conv_bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.conv_weight, a=math.sqrt(5))
        bound = 1.0 / math.sqrt(in_channels * kernel_size * kernel_size)
        nn.init.uniform_(self.conv_bias, -bound, bound)
        # then the extra bias, drawn like torch.randn(bias_shape)
        self.bias = nn.Parameter(nn.init.normal_(torch.empty(bias_shape)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_ext.conv_relu_bias_forward(x, self.conv_weight, self.conv_bias, self.bias)
