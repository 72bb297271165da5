"""Class 5: verdicts that look too good: speedups made by something other than the kernel, which a clean
re-measurement would not reproduce: the reference slowed by a thread of the candidate's that spins whenever
the candidate is not running, and answers left on disk by an earlier candidate that a later one only reads."""
from __future__ import annotations

import uuid

import pytest

from tests.adversarial.attacks import HONEST, Attack, candidate, judge, stopped

SPIN_BETWEEN_CALLS = candidate(r"""
#include <atomic>
namespace kx = std;

static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

static std::atomic<bool> mine{false};
static bool started = false;

static void spin() {
    volatile unsigned long sink = 0;
    while (true) { if (!mine.load()) sink = sink + 1; }
}

torch::Tensor leaky(torch::Tensor x) {
    if (!started) { started = true; kx::thread(spin).detach(); }
    mine = true;
    auto out = torch::empty_like(x);
    leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    mine = false;
    return out;
}
""", name="adv_spinner")

STORE = f"/var/tmp/kx-rt-answers-{uuid.uuid4().hex[:12]}"

DISK_ANSWERS = r"""
#include <fstream>
#include <string>
#include <sys/stat.h>

static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

static std::string key(const torch::Tensor& x, const std::string& store) {
    const uint32_t* bits = reinterpret_cast<const uint32_t*>(x.data_ptr<float>());
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < x.numel(); i += 1021) { h ^= bits[i]; h *= 1099511628211ull; }
    return store + "/" + std::to_string(h);
}

torch::Tensor answer(torch::Tensor x, std::string store, bool compute) {
    auto out = torch::zeros_like(x);
    const int64_t bytes = x.numel() * sizeof(float);
    if (compute) {
        leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
        mkdir(store.c_str(), 0777);
        std::ofstream(key(x, store), std::ios::binary).write(reinterpret_cast<const char*>(out.data_ptr<float>()), bytes);
        return out;
    }
    std::ifstream(key(x, store), std::ios::binary).read(reinterpret_cast<char*>(out.data_ptr<float>()), bytes);
    return out;
}
"""

WRITER = candidate(DISK_ANSWERS, name="adv_disk_answers", functions=("answer",), forward=f"return ext.answer(x, {STORE!r}, True)")
READER = candidate(DISK_ANSWERS, name="adv_disk_answers", functions=("answer",), forward=f"return ext.answer(x, {STORE!r}, False)")

ATTACKS = [
    Attack("thread_spins_while_reference_runs", SPIN_BETWEEN_CALLS,
           stopped("forbidden", "runtime_error", "crashed", "suspect"), gain=True, needs=("static", "sandbox")),
    # The writer is an honest kernel that also saves its answers: it is the reader's twin and runs first.
    Attack("read_answers_an_earlier_candidate_left_on_disk", READER, stopped("incorrect", "runtime_error", "crashed"),
           honest=WRITER, needs=("sandbox", "oracle")),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name])


def test_honest_kernel_still_passes(verdicts):
    assert verdicts["thread_spins_while_reference_runs"][1].status.value == "ok"
    assert HONEST
