import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// y = relu(conv2d(x, W) + conv_bias) + bias, stride 1, no padding; one thread per output element.
// x: (N, C, H, W), w: (OC, C, KH, KW), conv_bias: (OC), bias: (OC, 1, 1) -> y: (N, OC, OH, OW)
__global__ void conv_relu_bias_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ cb, const float* __restrict__ b2,
                                      float* __restrict__ y,
                                      int N, int C, int H, int W, int OC, int KH, int KW, int OH, int OW) {
    const int64_t total = (int64_t)N * OC * OH * OW;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int ow = (int)(idx % OW);
        const int oh = (int)((idx / OW) % OH);
        const int oc = (int)((idx / ((int64_t)OW * OH)) % OC);
        const int n = (int)(idx / ((int64_t)OW * OH * OC));
        float acc = cb[oc];
        for (int c = 0; c < C; ++c) {
            const float* xp = x + (((int64_t)n * C + c) * H + oh) * W + ow;
            const float* wp = w + ((int64_t)oc * C + c) * KH * KW;
            for (int kh = 0; kh < KH; ++kh) {
                for (int kw = 0; kw < KW; ++kw) acc += xp[(int64_t)kh * W + kw] * wp[kh * KW + kw];
            }
        }
        y[idx] = (acc > 0.0f ? acc : 0.0f) + b2[oc];
    }
}

torch::Tensor conv_relu_bias_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias,
                                     torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && conv_bias.is_cuda() && bias.is_cuda(),
                "tensors must be on the GPU");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "expected 4-D input and weight");
    x = x.contiguous();
    weight = weight.contiguous();
    conv_bias = conv_bias.contiguous();
    bias = bias.contiguous();
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
    TORCH_CHECK(weight.size(1) == C, "channel mismatch");
    TORCH_CHECK(conv_bias.numel() == OC && bias.numel() == OC, "bias size mismatch");
    const int64_t OH = H - KH + 1, OW = W - KW + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "kernel larger than input");
    auto y = torch::empty({N, OC, OH, OW}, x.options());
    const int64_t total = y.numel();
    if (total == 0) return y;
    const int threads = 256;
    int64_t blocks = (total + threads - 1) / threads;
    if (blocks > 1048576) blocks = 1048576;
    conv_relu_bias_kernel<<<(unsigned int)blocks, threads>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), conv_bias.data_ptr<float>(), bias.data_ptr<float>(),
        y.data_ptr<float>(), (int)N, (int)C, (int)H, (int)W, (int)OC, (int)KH, (int)KW, (int)OH, (int)OW);
    return y;
}
"""

cpp_source = (
    "torch::Tensor conv_relu_bias_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor conv_bias, "
    "torch::Tensor bias);"
)

conv_ext = load_inline(
    name="builtin_cuda_l2_conv_relu_bias",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv_relu_bias_forward"],
    extra_cuda_cflags=["-O3"],
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
