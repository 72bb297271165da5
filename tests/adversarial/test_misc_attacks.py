"""Other attacks: reading the reference's output out of the process's own memory, outputs that alias or
overwrite the inputs, dtype and type games (a tensor subclass built with ``type``)."""
from __future__ import annotations

import pytest

from tests.adversarial.attacks import Attack, candidate, judge, stopped

# The reference ran first and its output is still alive: find it by the first values it must hold (eight
# elements cost nothing) in the writable mappings of /proc/self/maps, and copy it. Not found: zeros.
SCAN_FOR_REFERENCE_OUTPUT = candidate(r"""
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

static float leaky1(float v) { return (v > 0.f ? v : 0.f) + 0.5f * v; }

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    const float* in = xc.data_ptr<float>();
    const int64_t n = xc.numel();
    float want[8];
    for (int i = 0; i < 8; ++i) want[i] = leaky1(in[i]);
    const float last = leaky1(in[n - 1]);
    auto out = torch::zeros_like(xc);
    float* o = out.data_ptr<float>();
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
        unsigned long lo = 0, hi = 0;
        char perms[8] = {0};
        if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if (perms[0] != 'r' || perms[1] != 'w') continue;
        if (line.find('[') != std::string::npos && line.find("[heap]") == std::string::npos) continue;
        if (hi - lo < static_cast<unsigned long>(n) * sizeof(float)) continue;
        const float* p = reinterpret_cast<const float*>(lo);
        const float* end = reinterpret_cast<const float*>(hi) - n;
        for (; p <= end; ++p) {
            if (*p == want[0] && p != o && std::memcmp(p, want, sizeof want) == 0 && p[n - 1] == last) {
                std::memcpy(o, p, n * sizeof(float));
                return out;
            }
        }
    }
    return out;
}
""", name="adv_scan_memory")

OUTPUT_IS_THE_INPUT = candidate(r"""
torch::Tensor leaky(torch::Tensor x) {
    float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) { float v = p[i]; p[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
    return x;
}
""", name="adv_in_place")

DOUBLE_OUTPUT = candidate(r"""
torch::Tensor leaky(torch::Tensor x) {
    auto out = torch::empty(x.sizes(), x.options().dtype(torch::kFloat64));
    const float* in = x.data_ptr<float>();
    double* o = out.data_ptr<double>();
    for (int64_t i = 0; i < x.numel(); ++i) { double v = in[i]; o[i] = (v > 0 ? v : 0) + 0.5 * v; }
    return out;
}
""", name="adv_double")

SUBCLASS_BUILT_WITH_TYPE = candidate(prelude='''
_Lazy = type("Lazy", (torch.Tensor,), {})
''', forward='''
return ext.leaky(x).as_subclass(_Lazy)
''')

ATTACKS = [
    Attack("scan_own_memory_for_reference_output", SCAN_FOR_REFERENCE_OUTPUT, stopped("incorrect", "forbidden", "crashed"),
           needs=("oracle",)),
    Attack("output_is_the_input_overwritten", OUTPUT_IS_THE_INPUT, stopped("incorrect")),
    Attack("float64_output_for_float32_problem", DOUBLE_OUTPUT, stopped("incorrect")),
    Attack("tensor_subclass_built_with_type", SUBCLASS_BUILT_WITH_TYPE, stopped("incorrect", "forbidden")),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
