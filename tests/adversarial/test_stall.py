"""Class 3: stalling or exhausting the evaluator: a source that makes a static-check regex go quadratic once
folded, a parser-depth bomb, hangs in C++ and in Python (with SIGTERM ignored), a bounded fork bomb through
the raw syscall, memory exhaustion, a flood of output and an exception message of 50 MB. Attacks on the
evaluator's own process run in a child evaluator with a deadline."""
from __future__ import annotations

import time

import pytest

from tests.adversarial.attacks import HONEST, PROBLEM, Attack, candidate, config, judge, stopped
from tests.adversarial.isolated import evaluate_with_deadline

CONFIG = {"hang_s": 8, "memory_limit_gb": 2.0}

# ".a<" never closes: the method-call pattern's `<[^;(){}]*>` rescans to the end from every occurrence.
QUADRATIC_REGEX = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

body = "torch::Tensor leaky(torch::Tensor x) { return x; }\\n" + ".a<" * 600000
ext = load_inline(name="adv_quadratic", cpp_sources=body, functions=["leaky"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.leaky(x)
'''

PARSER_DEPTH = HONEST.replace("return ext.leaky(x)", "return ext.leaky(x)\n\n\nDEPTH = " + "-" * 100000 + "1\n")

CPP_HANG = candidate(r"""
#include <csignal>
torch::Tensor leaky(torch::Tensor x) {
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    volatile bool forever = true;
    while (forever) {}
    return x;
}
""", name="adv_cpp_hang")

# a plain spin: what the hang limit alone must stop
CPP_SPIN = candidate(r"""
torch::Tensor leaky(torch::Tensor x) {
    volatile bool forever = true;
    while (forever) {}
    return x;
}
""", name="adv_cpp_spin")

PYTHON_HANG = candidate(forward='''
spins = 0
while spins >= 0:
    spins += 1
return ext.leaky(x)
''')

# fork() and vfork() are refused by name; the syscall number is not. Bounded at 2000 so that a failing
# sandbox costs this machine little.
FORK_BOMB = candidate(r"""
#include <sys/syscall.h>
#include <unistd.h>
torch::Tensor leaky(torch::Tensor x) {
    for (int i = 0; i < 2000; ++i) {
        long pid = syscall(SYS_clone, 17 /* SIGCHLD */, 0, 0, 0, 0);
        if (pid == 0) { while (true) sleep(1000); }
        if (pid < 0) break;
    }
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
    return out;
}
""", name="adv_fork_bomb")

MEMORY_EXHAUSTION = candidate(r"""
#include <cstring>
#include <vector>
torch::Tensor leaky(torch::Tensor x) {
    std::vector<char*> held;
    for (int i = 0; i < 4096; ++i) {
        char* block = new char[64 << 20];
        std::memset(block, 1, 64 << 20);
        held.push_back(block);
    }
    return x;
}
""", name="adv_memory")

OUTPUT_FLOOD = candidate(r"""
#include <cstdio>
#include <string>
static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}
static bool flooded = false;
torch::Tensor leaky(torch::Tensor x) {
    if (!flooded) {
        flooded = true;
        std::string line(1 << 20, 'A');
        for (int i = 0; i < 100; ++i) { fwrite(line.data(), 1, line.size(), stdout); fwrite(line.data(), 1, line.size(), stderr); }
        fflush(stdout);
    }
    auto out = torch::empty_like(x);
    leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}
""", name="adv_flood")

HUGE_EXCEPTION = candidate(forward='''
ext.leaky(x)
raise ValueError("A" * 50000000)
''')

ATTACKS = [
    # ignoring SIGTERM needs a signal handler, which the runner's filter refuses: crashed at the first call
    Attack("cpp_infinite_loop_ignoring_sigterm", CPP_HANG, stopped("crashed", "timeout")),
    Attack("cpp_infinite_loop", CPP_SPIN, stopped("timeout")),
    Attack("python_infinite_loop", PYTHON_HANG, stopped("timeout")),
    Attack("fork_bomb_through_raw_syscall", FORK_BOMB, stopped("forbidden", "runtime_error", "crashed", "timeout"),
           needs=("static", "sandbox")),
    Attack("memory_exhaustion", MEMORY_EXHAUSTION, stopped("runtime_error", "crashed", "timeout")),
    Attack("exception_message_of_50_mb", HUGE_EXCEPTION, stopped("runtime_error", "forbidden")),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))


def test_what_reaches_the_model_stays_bounded(verdicts):
    """Floods of output and huge messages end as verdicts of bounded size."""
    for name in ("exception_message_of_50_mb", "memory_exhaustion", "cpp_infinite_loop_ignoring_sigterm"):
        v, _ = verdicts[name]
        assert len(v.feedback) <= 2000 and len(v.reason) <= 2200, (name, len(v.feedback), len(v.reason))


def test_output_flood_is_drained_and_the_kernel_still_judged(build_cache):
    from kevin_exp.bench.evaluator import EvalItem, Evaluator

    with Evaluator(config(build_cache, **CONFIG)) as ev:
        [v] = ev.evaluate([EvalItem("flood", PROBLEM, OUTPUT_FLOOD)])
    assert v.status.value == "ok", v.reason
    assert len(v.feedback) <= 2000


@pytest.mark.parametrize("name, source", [("quadratic_regex_after_folding", QUADRATIC_REGEX), ("parser_depth_bomb", PARSER_DEPTH)])
def test_static_checks_answer_within_a_deadline(build_cache, name, source):
    """The parent's checks run on what folding makes of 30 bytes of source: they must refuse or finish in time."""
    start = time.monotonic()
    verdicts = evaluate_with_deadline([(name, PROBLEM, source)], config(build_cache, hang_s=10), deadline_s=45)
    assert verdicts is not None, f"{name}: the evaluator gave no verdict within 45 s (stalled or died)"
    [v] = verdicts
    assert v.status.value in ("forbidden", "format_error", "compile_error"), (v.status, v.reason)
    assert time.monotonic() - start < 45
