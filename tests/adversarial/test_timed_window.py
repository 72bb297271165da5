"""Work done after the clock, and inputs mutated where nobody looks. The parent's outside clock brackets "go" to
"ran"; what the runner did after "ran" (making a strided output dense, sampling it, reading lazily filled pages)
used to be free, and which calls compared the inputs afterwards was predictable (a fixed schedule, and the NaN
poison only before checked calls). Each attack here moves work out of the timed window or writes into its
input on the calls it thinks are unchecked; each is a speed attack: ok is fine only within 1.5x of its twin."""
from __future__ import annotations

import pytest

from kevin_exp.bench.config import CheckRules
from tests.adversarial.attacks import HONEST, PROBLEM, Attack, candidate, judge, stopped
from tests.conftest import fixture_text

# the in-place attacks on the cpu size of the relu problem (512 x 2048, 4 MiB)
PROBLEM_4MIB = fixture_text("problem_relu.py")

# the lazy-page attack maps memory and installs a fault handler: refused by the static native rules (mmap,
# mprotect), which are a tripwire only (raw system calls get around them); with them off, the design must stop it
CONFIG = {"rules": CheckRules(restrict_imports=False)}

LEAKY_INTO = r"""
static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}
"""

# The schedule is fixed (2 checked calls, 1 warm-up, 12 timed, 1 checked): on every other call the result is
# written into the input, which is returned as the output; no allocation, no second buffer to fill.
IN_PLACE_BY_COUNT = candidate(LEAKY_INTO + r"""
static int64_t calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    const int64_t call = calls++;
    const bool checked = call < 2 || call >= 15;
    if (checked) {
        auto out = torch::empty_like(x);
        leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
        return out;
    }
    leaky_into(x.data_ptr<float>(), x.data_ptr<float>(), x.numel());
    return x;
}
""", name="adv_in_place_by_count")

# The allocator is filled with NaN only before checked calls: a fresh buffer of the output's size that reads
# NaN says "this call is checked" (the first two calls, where the allocator may hand out fresh pages, are).
IN_PLACE_UNLESS_POISONED = candidate(LEAKY_INTO + r"""
#include <cmath>

static int64_t calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    auto probe = torch::empty_like(x);
    const float* p = probe.data_ptr<float>();
    const int64_t n = probe.numel();
    if (calls++ < 2 || std::isnan(p[0]) || std::isnan(p[n / 2]) || std::isnan(p[n - 1])) {
        leaky_into(x.data_ptr<float>(), probe.data_ptr<float>(), n);
        return probe;
    }
    leaky_into(x.data_ptr<float>(), x.data_ptr<float>(), n);
    return x;
}
""", name="adv_in_place_unless_poisoned")

# Against the alias check: the input's memory returned through a tensor of its own (another storage object).
IN_PLACE_THROUGH_FROM_BLOB = candidate(LEAKY_INTO + r"""
static int64_t calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    const int64_t call = calls++;
    if (call < 2 || call >= 15) {
        auto out = torch::empty_like(x);
        leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
        return out;
    }
    leaky_into(x.data_ptr<float>(), x.data_ptr<float>(), x.numel());
    return torch::from_blob(x.data_ptr<float>(), x.sizes(), x.options());
}
""", name="adv_in_place_from_blob")

# The problem's answer is transposed: the kernel computes it row by row and returns a transposed view, so the
# harness's own densifying copy does the transposition after the clock.
TRANSPOSED_PROBLEM = PROBLEM.replace("return torch.relu(x) + 0.5 * x", "return (torch.relu(x) + 0.5 * x).t().contiguous()")
assert TRANSPOSED_PROBLEM != PROBLEM

ROW_MAJOR = LEAKY_INTO + r"""
torch::Tensor leaky(torch::Tensor x) {
    auto out = torch::empty_like(x);
    leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out.t();
}
"""
TRANSPOSED_VIEW = candidate(ROW_MAJOR, name="adv_transposed_view")
# the twin makes the same view dense itself, inside its own forward
TRANSPOSED_HONEST = candidate(ROW_MAJOR, name="adv_transposed_view", forward="return ext.leaky(x).contiguous()")

# The output's pages are mapped unreadable; a fault handler computes each page when it is first read, which
# is when the harness copies or samples the output, after "ran".
LAZY_PAGES = candidate(LEAKY_INTO + r"""
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>

static const float* lazy_in = nullptr;
static char* lazy_out = nullptr;
static size_t lazy_bytes = 0;
static long page = 4096;

static void fill_page(int, siginfo_t* info, void*) {
    char* addr = static_cast<char*>(info->si_addr);
    if (lazy_out == nullptr || addr < lazy_out || addr >= lazy_out + lazy_bytes) {
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    char* first = lazy_out + (addr - lazy_out) / page * page;
    mprotect(first, page, PROT_READ | PROT_WRITE);
    const size_t n = std::min<size_t>(page, lazy_out + lazy_bytes - first) / sizeof(float);
    leaky_into(lazy_in + (first - lazy_out) / sizeof(float), reinterpret_cast<float*>(first), n);
}

torch::Tensor leaky(torch::Tensor x) {
    static bool armed = false;
    if (!armed) {
        page = sysconf(_SC_PAGESIZE);
        struct sigaction sa = {};
        sa.sa_sigaction = fill_page;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigaction(SIGSEGV, &sa, nullptr);
        armed = true;
    }
    const size_t bytes = x.numel() * sizeof(float);
    const size_t mapped = (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    lazy_in = x.data_ptr<float>();
    lazy_out = static_cast<char*>(p);
    lazy_bytes = bytes;
    return torch::from_blob(p, x.sizes(), [mapped](void* q) { munmap(q, mapped); }, x.options());
}
""", name="adv_lazy_pages")

SPEED = stopped("incorrect", "suspect", "forbidden", "runtime_error", "crashed")
# an output over an input's memory, or an input changed on any call, is refused: these gain on the calls they
# write in place, so ok (at any speed) would mean the calls they chose went unchecked
REFUSED = stopped("incorrect")

ATTACKS = [
    Attack("in_place_into_input_on_unchecked_calls_by_count", IN_PLACE_BY_COUNT, REFUSED),
    Attack("in_place_into_input_on_unchecked_calls_by_count_4mib", IN_PLACE_BY_COUNT, REFUSED, problem=PROBLEM_4MIB),
    # poisoned before every call now: it never writes in place, or does on a call the poison missed and is refused
    Attack("in_place_into_input_unless_allocator_poisoned", IN_PLACE_UNLESS_POISONED, REFUSED | SPEED, gain=True),
    Attack("in_place_into_input_returned_through_from_blob", IN_PLACE_THROUGH_FROM_BLOB, REFUSED),
    Attack("transposed_view_made_dense_by_the_harness", TRANSPOSED_VIEW, SPEED, honest=TRANSPOSED_HONEST, gain=True,
           problem=TRANSPOSED_PROBLEM),
    Attack("output_pages_filled_when_the_harness_reads_them", LAZY_PAGES, SPEED, honest=HONEST, gain=True),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
