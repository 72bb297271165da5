"""The menu's C++ kernels for the cpu backend: one source per kind, around a reference's per-element function.

Each kind is an honest implementation strategy, not a stub. ``fast`` is one fused, vectorised pass over the
tensor with OpenMP at -O3 -march=native -ffast-math (the reference makes one pass per operator and a temporary
tensor for each). ``slow`` is the same arithmetic in a single thread, unoptimised (-O0), element by element
through tensor accessors. ``off_by_one`` reads each output's left neighbour; ``broken`` names a variable it never declared. ``probe``, the
profile's submission, copies its input in the fast kernel's loop: the time of the memory pass alone, and not the
reference's result.
"""
from __future__ import annotations

PROGRAM = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>

static inline float square(float v) {{ return v * v; }}
static inline float op(float v) {{ return {expr}; }}

torch::Tensor forward(torch::Tensor x) {{
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
{body}
    return out;
}}
"""

ext = load_inline(name="{name}", cpp_sources=cpp_source, functions=["forward"], extra_cflags={cflags},
                  extra_ldflags={ldflags})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.forward(x)
'''

FAST = """    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = op(in[i]);"""

SLOW = """    (void)in; (void)o; (void)n;
    auto a = x.accessor<float, 2>();
    auto b = out.accessor<float, 2>();
    for (int64_t r = 0; r < x.size(0); ++r)
        for (int64_t c = 0; c < x.size(1); ++c) b[r][c] = op(a[r][c]);"""

OFF_BY_ONE = """    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = op(in[i > 0 ? i - 1 : 0]);"""

BROKEN = """    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = op(in[j]);"""

PROBE = """    #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = in[i];"""

OPENMP_O3 = (["-O3", "-fopenmp"], ["-fopenmp"])
# min/max on floats vectorise only without IEEE's NaN and signed-zero rules; the menu's inputs are finite
VECTORISED = (["-O3", "-march=native", "-ffast-math", "-fopenmp"], ["-fopenmp"])

# kind -> (loop body, (extra_cflags, extra_ldflags))
KERNELS: dict[str, tuple[str, tuple[list[str], list[str]]]] = {
    "fast": (FAST, VECTORISED),
    "slow": (SLOW, (["-O0"], [])),
    "off_by_one": (OFF_BY_ONE, OPENMP_O3),
    "broken": (BROKEN, OPENMP_O3),
    "probe": (PROBE, VECTORISED),
}


def cpu_program(kind: str, expr: str, name: str) -> str:
    """The candidate program of one menu kind for a reference whose per-element function is ``expr`` (C++, of
    ``float v``); ``name`` names its extension."""
    body, (cflags, ldflags) = KERNELS[kind]
    return PROGRAM.format(expr=expr, body=body, name=name, cflags=cflags, ldflags=ldflags)
