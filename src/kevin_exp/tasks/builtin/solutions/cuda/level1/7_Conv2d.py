import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// Direct 2D convolution, stride 1, no padding, with bias: one thread per output element.
// x: (N, C, H, W), w: (OC, C, KH, KW), b: (OC) -> y: (N, OC, OH, OW)
__global__ void conv2d_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, float* __restrict__ y,
                              int N, int C, int H, int W, int OC, int KH, int KW, int OH, int OW) {
    const int64_t total = (int64_t)N * OC * OH * OW;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int ow = (int)(idx % OW);
        const int oh = (int)((idx / OW) % OH);
        const int oc = (int)((idx / ((int64_t)OW * OH)) % OC);
        const int n = (int)(idx / ((int64_t)OW * OH * OC));
        float acc = b[oc];
        for (int c = 0; c < C; ++c) {
            const float* xp = x + (((int64_t)n * C + c) * H + oh) * W + ow;
            const float* wp = w + ((int64_t)oc * C + c) * KH * KW;
            for (int kh = 0; kh < KH; ++kh) {
                for (int kw = 0; kw < KW; ++kw) acc += xp[(int64_t)kh * W + kw] * wp[kh * KW + kw];
            }
        }
        y[idx] = acc;
    }
}

torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "tensors must be on the GPU");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4, "expected 4-D input and weight");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
    TORCH_CHECK(weight.size(1) == C, "channel mismatch");
    TORCH_CHECK(bias.numel() == OC, "bias size mismatch");
    const int64_t OH = H - KH + 1, OW = W - KW + 1;
    TORCH_CHECK(OH > 0 && OW > 0, "kernel larger than input");
    auto y = torch::empty({N, OC, OH, OW}, x.options());
    const int64_t total = y.numel();
    if (total == 0) return y;
    const int threads = 256;
    int64_t blocks = (total + threads - 1) / threads;
    if (blocks > 1048576) blocks = 1048576;
    conv2d_kernel<<<(unsigned int)blocks, threads>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
        (int)N, (int)C, (int)H, (int)W, (int)OC, (int)KH, (int)KW, (int)OH, (int)OW);
    return y;
}
"""

cpp_source = "torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

conv_ext = load_inline(
    name="builtin_cuda_l1_conv2d",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv2d_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super(ModelNew, self).__init__()
        # same parameters, creation order and initialisation as nn.Conv2d
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        fan_in = in_channels * kernel_size * kernel_size
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_ext.conv2d_forward(x, self.weight, self.bias)
