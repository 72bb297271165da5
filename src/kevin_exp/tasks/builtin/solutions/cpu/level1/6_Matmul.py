import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// C = A (M x K) * B (K x N), i-k-j loop order so the inner loop streams rows of B and C.
torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B) {
    A = A.contiguous();
    B = B.contiguous();
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(0), "shape mismatch");
    const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::zeros({M, N}, A.options());
    const float* a = A.data_ptr<float>();
    const float* b = B.data_ptr<float>();
    float* c = C.data_ptr<float>();
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i) {
        float* ci = c + i * N;
        for (int64_t k = 0; k < K; ++k) {
            const float aik = a[i * K + k];
            const float* bk = b + k * N;
            for (int64_t j = 0; j < N; ++j) ci[j] += aik * bk[j];
        }
    }
    return C;
}
"""

matmul_ext = load_inline(
    name="builtin_cpu_l1_matmul",
    cpp_sources=cpp_source,
    functions=["matmul_forward"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul_ext.matmul_forward(A, B)
