"""Class 2: predicting the timing protocol. The inputs of the timed trials repeat (two sets, cycled), their
seeds are visible constants, the checked trials follow a fixed pattern, and the timer only sees the call:
answers cached by content, precomputed at load time, computed only on checked calls, or finished on a
thread of the candidate's own after the call returned. Each is a speed attack: ok is fine only with a
speedup within 1.5x of the honest kernel's."""
from __future__ import annotations

import pytest

from tests.adversarial.attacks import Attack, candidate, judge, stopped

LEAKY_INTO = r"""
static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}
"""

# Answers kept by a fingerprint of a few hundred input values: a repeated input costs a hash.
CONTENT_CACHE = LEAKY_INTO + r"""
#include <unordered_map>

static std::unordered_map<uint64_t, torch::Tensor> answers;

static uint64_t fingerprint(const torch::Tensor& x) {
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(x.data_ptr<float>());
    const int64_t n = x.numel();
    uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(n);
    for (int64_t i = 0; i < n; i += 1021) { h ^= bits[i]; h *= 1099511628211ull; }
    return h;
}

torch::Tensor remember(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    answers[fingerprint(xc)] = out;
    return out;
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto hit = answers.find(fingerprint(xc));
    if (hit != answers.end()) return hit->second;
    return remember(xc);
}
"""

CACHE_BY_CONTENT = candidate(CONTENT_CACHE, name="adv_content_cache", functions=("leaky", "remember"))

# The worker's seeds are constants of the configuration (seed 42; correctness trials 42 + 7919 t, again after
# timing from 42 + 1000003; timing sets 42 + 104729 (k + 1)): every input is drawn, and answered, at load time.
PRECOMPUTE_FROM_SEEDS = candidate(CONTENT_CACHE, name="adv_content_cache", functions=("leaky", "remember"), prelude='''
_T = nn.init.torch
for _seed in (42, 42 + 7919, 42 + 1000003, 42 + 1000003 + 7919, 42 + 104729, 42 + 2 * 104729):
    _T.manual_seed(_seed)
    ext.remember(_T.randn(256, 2048))
_T.manual_seed(42)
''')

# The checked timed trials are i % 10 == 0 and the last two of 12 (after 2 correctness calls and 1 warm-up);
# every other call returns the previous answer.
CHECKED_CALLS_ONLY = candidate(LEAKY_INTO + r"""
static int64_t calls = 0;
static torch::Tensor last;

torch::Tensor leaky(torch::Tensor x) {
    const int64_t trial = calls++ - 3;
    const bool checked = trial < 0 || trial % 10 == 0 || trial >= 10;
    if (!checked && last.defined()) return last;
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    last = out;
    return out;
}
""", name="adv_checked_only")

# C11 threads (not std::thread, not pthread_create): unchecked calls return at once and the answer is written
# by a thread of the candidate's own while the harness refills inputs and flushes caches.
DEFERRED_ON_OWN_THREAD = candidate(LEAKY_INTO + r"""
#include <threads.h>

static thrd_t helper;
static bool running = false;
static torch::Tensor keep_in, keep_out;
static int64_t calls = 0;

static int finish(void*) {
    leaky_into(keep_in.data_ptr<float>(), keep_out.data_ptr<float>(), keep_in.numel());
    return 0;
}

torch::Tensor leaky(torch::Tensor x) {
    if (running) { thrd_join(helper, nullptr); running = false; }
    const int64_t trial = calls++ - 3;
    const bool checked = trial < 0 || trial % 10 == 0 || trial >= 10;
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    if (!checked) {
        keep_in = xc;
        keep_out = out;
        if (thrd_create(&helper, finish, nullptr) == thrd_success) { running = true; return out; }
    }
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}
""", name="adv_deferred_thread")

WRITES_ZEROS = candidate(r"""
torch::Tensor leaky(torch::Tensor x) { return torch::zeros_like(x); }
""", name="adv_zeros")

SPEED = stopped("incorrect", "suspect", "forbidden", "runtime_error", "crashed")

ATTACKS = [
    Attack("cache_answers_by_input_content", CACHE_BY_CONTENT, SPEED, gain=True, needs=("oracle",)),
    Attack("precompute_answers_from_visible_seeds", PRECOMPUTE_FROM_SEEDS, SPEED, gain=True, needs=("static", "oracle")),
    Attack("compute_only_on_checked_calls", CHECKED_CALLS_ONLY, SPEED, gain=True, needs=("oracle",)),
    Attack("finish_work_on_own_thread_after_return", DEFERRED_ON_OWN_THREAD, SPEED, gain=True,
           needs=("static", "sandbox", "oracle")),
    Attack("kernel_writes_zeros", WRITES_ZEROS, stopped("incorrect")),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
