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

READER = candidate(DISK_ANSWERS, name="adv_disk_answers", functions=("answer",), forward=f"return ext.answer(x, {STORE!r}, False)")

# The runner times its own calls with the process's monotonic clock. Native code rewrites the entry of libc's
# clock_gettime into a jump to its own function, which reads the true time from the vDSO (found by its ELF
# symbol table, through getauxval) and runs CLOCK_MONOTONIC at 40% speed from then on. The page is made
# writable with pkey_mprotect (pkey -1: plain mprotect, under a name the static rule does not list), else
# written through /proc/self/mem. Every output is right and the lie is the same in every runner, so the
# recheck agrees; the parent's outside clock (which includes copying inputs in) is longer than either.
_SLOW_CLOCK_CPP = r"""
#include <cstdint>
#include <cstring>
#include <ctime>
#include <elf.h>
#include <fcntl.h>
#include <sys/auxv.h>
#include <unistd.h>

extern "C" int pkey_mprotect(void* addr, size_t len, int prot, int pkey);

static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

typedef int (*gettime_fn)(clockid_t, struct timespec*);
static gettime_fn true_gettime = nullptr;
static int64_t since_ns = 0;
static long slowed = 0;

static gettime_fn vdso_gettime() {
    const unsigned char* image = reinterpret_cast<const unsigned char*>(getauxval(AT_SYSINFO_EHDR));
    if (!image) return nullptr;
    auto eh = reinterpret_cast<const Elf64_Ehdr*>(image);
    auto ph = reinterpret_cast<const Elf64_Phdr*>(image + eh->e_phoff);
    uintptr_t bias = reinterpret_cast<uintptr_t>(image);
    for (int i = 0; i < eh->e_phnum; ++i)
        if (ph[i].p_type == PT_LOAD) { bias -= ph[i].p_vaddr - ph[i].p_offset; break; }
    auto sh = reinterpret_cast<const Elf64_Shdr*>(image + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_type != SHT_DYNSYM) continue;
        auto syms = reinterpret_cast<const Elf64_Sym*>(image + sh[i].sh_offset);
        auto names = reinterpret_cast<const char*>(image + sh[sh[i].sh_link].sh_offset);
        for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k)
            if (syms[k].st_value && strcmp(names + syms[k].st_name, "__vdso_clock_gettime") == 0)
                return reinterpret_cast<gettime_fn>(bias + syms[k].st_value);
    }
    return nullptr;
}

static int slow_gettime(clockid_t id, struct timespec* ts) {
    int r = true_gettime(id, ts);
    if (r == 0 && id == CLOCK_MONOTONIC && since_ns) {
        int64_t now = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec;
        int64_t shown = since_ns + (now - since_ns) * 2 / 5;
        ts->tv_sec = shown / 1000000000LL;
        ts->tv_nsec = shown % 1000000000LL;
        ++slowed;
    }
    return r;
}

static bool overwrite(void* where, const unsigned char* code, size_t len) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    void* first = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(where) & ~(page - 1));
    if (pkey_mprotect(first, 2 * page, 7, -1) == 0) { memcpy(where, code, len); return true; }
    int fd = open("/proc/self/mem", O_RDWR);
    if (fd < 0) return false;
    bool done = pwrite(fd, code, len, (off_t)reinterpret_cast<uintptr_t>(where)) == (ssize_t)len;
    close(fd);
    return done;
}

int slow_down() {
    true_gettime = vdso_gettime();
    TORCH_CHECK(true_gettime != nullptr, "no vDSO clock");
    struct timespec ts;
    true_gettime(CLOCK_MONOTONIC, &ts);
    since_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    unsigned char code[12] = {0x48, 0xB8};  // movabs rax, slow_gettime; jmp rax
    uint64_t target = reinterpret_cast<uint64_t>(&slow_gettime);
    memcpy(code + 2, &target, sizeof(target));
    code[10] = 0xFF;
    code[11] = 0xE0;
    TORCH_CHECK(overwrite(reinterpret_cast<void*>(&clock_gettime), code, sizeof(code)), "patch refused");
    return 0;
}

static long calls = 0;

torch::Tensor leaky(torch::Tensor x) {
    TORCH_CHECK(++calls < 6 || slowed > 0, "the timer never read the slowed clock");
    auto out = torch::empty_like(x);
    leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}
"""

SLOW_CLOCK = candidate(_SLOW_CLOCK_CPP, name="adv_slow_clock", functions=("slow_down", "leaky"), prelude="ext.slow_down()\n")


def _lies_on_one_call_in_ten(cpp: str) -> str:
    """The same clock patch, lying on only every tenth call, and then at 10% speed: a lie aimed at the minimum of
    the timed calls (``evaluator.timing_statistic=min``), which one fast-looking call sets and the median ignores.
    Where a lie ends, the clock stays behind the true time by what it hid, so no later call looks longer than the
    parent saw it (which would be ``suspect`` at once)."""
    edits = [
        ("static long slowed = 0;", "static long slowed = 0;\nstatic bool lying = false;\nstatic int64_t offset = 0;"),
        ("int64_t shown = since_ns + (now - since_ns) * 2 / 5;",
         "int64_t shown = lying ? since_ns - offset + (now - since_ns) / 10 : now - offset;"),
        ('TORCH_CHECK(++calls < 6 || slowed > 0, "the timer never read the slowed clock");',
         "++calls;\n"
         "    struct timespec ts;\n"
         "    true_gettime(CLOCK_MONOTONIC, &ts);\n"
         "    int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;\n"
         "    if (lying) offset = now - (since_ns - offset + (now - since_ns) / 10);\n"
         "    lying = calls % 10 == 0;\n"
         "    if (lying) since_ns = now;\n"
         '    TORCH_CHECK(calls < 12 || slowed > 0, "the timer never read the slowed clock");'),
    ]
    for old, new in edits:
        assert old in cpp, old
        cpp = cpp.replace(old, new)
    return cpp


SLOW_CLOCK_ON_ONE_CALL = candidate(_lies_on_one_call_in_ten(_SLOW_CLOCK_CPP), name="adv_slow_clock_one_call",
                                   functions=("slow_down", "leaky"), prelude="ext.slow_down()\n")

def _keeps_the_cpus_busy(cpp: str) -> str:
    """The same clock patch, and three threads started with it (after the calibration calls, at load) that spin
    for the rest of the run: some task always waits for a CPU during the trials, so the hidden-time check
    cannot tell the lie from the load (``verdict.contention_rose``)."""
    cpp = cpp.replace("#include <unistd.h>", "#include <unistd.h>\n#include <thread>", 1)
    old = "int slow_down() {\n"
    assert old in cpp
    spin = "    for (int k = 0; k < 3; ++k) std::thread([] { volatile unsigned long s = 0; for (;;) ++s; }).detach();\n"
    return cpp.replace(old, old + spin, 1)


SLOW_CLOCK_UNDER_ITS_OWN_LOAD = candidate(_keeps_the_cpus_busy(_SLOW_CLOCK_CPP), name="adv_slow_clock_busy",
                                          functions=("slow_down", "leaky"), prelude="ext.slow_down()\n")

ATTACKS = [
    Attack("thread_spins_while_reference_runs", SPIN_BETWEEN_CALLS,
           stopped("forbidden", "runtime_error", "crashed", "suspect"), gain=True, needs=("static", "sandbox")),
    # The writer is an honest kernel that also saves its answers: it is the reader's twin and runs first.
    # the static rules now refuse opening files from native code (forbidden); with them off, the sandbox's private
    # /tmp and read-only root stop it at run time (tests/integration/test_sandbox_isolation.py)
    Attack("read_answers_an_earlier_candidate_left_on_disk", READER,
           stopped("forbidden", "incorrect", "runtime_error", "crashed"), needs=("sandbox", "oracle", "static")),
    # runtime_error here means the patch did not take (its own checks raise), not that it was stopped
    Attack("slowed_monotonic_clock_reports_less", SLOW_CLOCK, stopped("forbidden", "crashed", "suspect", "incorrect"),
           gain=True, needs=("oracle",)),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))


def test_honest_kernel_still_passes(verdicts):
    assert verdicts["thread_spins_while_reference_runs"][1].status.value == "ok"
    assert HONEST


_ELEMENT = "{ float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }"
# the same result through sixteen dependent additions of a sixteenth (exact to ~1e-6): a call several times the
# path around it, which copies the output and the inputs back (as long as the plain kernel on this problem)
_SLOW_ELEMENT = ("{ float v = in[i], y = ((v > 0.f ? v : 0.f) + 0.5f * v) * 0.0625f, s = 0.f;"
                 " for (int j = 0; j < 16; ++j) s += y; o[i] = s; }")


def _slow_loop(source: str) -> str:
    assert source.count(_ELEMENT) == 1
    return source.replace(_ELEMENT, _SLOW_ELEMENT)


def test_slowed_clock_gains_nothing_when_only_the_outside_clock_stands_in_its_way(build_cache):
    """The same attack with the static rule that refuses its includes switched off, the runner's system-call
    filter too (it refuses making code writable: test_after_the_clock.py), and the hidden-time check, so the
    runner's clock really runs slow and only the parent's clock, which brackets the call, bounds the time the
    speedup uses. What the bound cannot know is how much of the outside time is the path around the call (the
    calibration's measure of it, subtracted); the liar gains what that measure is off, which on a kernel no
    longer than its path (the plain loop: copying the output and inputs back costs as much) is a large share of
    the call on some machines (4x its twin on one CI machine, 1.26x here). So a kernel several times its path:
    the attack and its twin run the same slower loop on an input four times the usual."""
    from kevin_exp.bench import CheckRules
    from tests.adversarial.attacks import HONEST, PROBLEM, config
    from tests.adversarial.conftest import evaluate_attacks

    problem = PROBLEM.replace('{"M": 256, "N": 2048}', '{"M": 1024, "N": 2048}')
    assert problem != PROBLEM
    attack = Attack("slowed_clock_past_the_static_rules", _slow_loop(SLOW_CLOCK), stopped("suspect"), gain=True,
                    problem=problem, honest=_slow_loop(HONEST))
    cfg = config(build_cache, rules=CheckRules(restrict_imports=False), forbid_new_tasks=False,
                 hidden_time_check=False)
    for attempt in range(3):  # measured again on a failure, like judge() (timing noise of a 2-core box)
        bad, good = evaluate_attacks([attack], cfg)[attack.name]
        try:
            assert bad.status.value == "ok", bad.reason
            timing = bad.extra["timing"]
            assert timing["used"] == "outside_bound" and timing["reported_ms"] < good.extra["timing"]["reported_ms"], timing
            judge(attack, bad, good)
            return
        except AssertionError as exc:
            if attempt == 2:
                raise AssertionError(f"{exc}\nattack timing: {bad.extra.get('timing')}\n"
                                     f"twin timing: {good.extra.get('timing')}") from None


def test_one_fast_looking_call_does_not_set_the_time_under_the_minimum(build_cache):
    """The speedup takes the fastest timed call (``timing_statistic=min``), so a runner could lie on one call only:
    its clock runs at 10% during every tenth call. The fastest reported call is then a tenth of the truth; the
    outside bound (least outside time - least calibration overhead - slack) is what stands, close to the runner's
    honest calls. On the input sixteen times the usual, so the bound's own noise on a busy 2-core machine (0.1-0.3
    ms) is small beside a call."""
    from kevin_exp.bench import CheckRules
    from tests.adversarial.attacks import PROBLEM, config
    from tests.adversarial.conftest import evaluate_attacks

    problem = PROBLEM.replace('{"M": 256, "N": 2048}', '{"M": 4096, "N": 2048}')
    assert problem != PROBLEM
    attack = Attack("slowed_clock_on_one_call", SLOW_CLOCK_ON_ONE_CALL, stopped("suspect"), gain=True, problem=problem)
    cfg = config(build_cache, rules=CheckRules(restrict_imports=False), forbid_new_tasks=False, timing_statistic="min")
    for attempt in range(3):  # measured again on a failure, like judge() (timing noise of a 2-core box)
        bad, good = evaluate_attacks([attack], cfg)[attack.name]
        try:
            if bad.status.value == "ok":
                timing, calls = bad.extra["timing"], bad.runtime_stats  # p25 of 12 calls: an honest one
                assert timing["statistic"] == "min" and timing["used"] == "outside_bound", timing
                assert calls.min_ms < 0.5 * calls.p25_ms, calls  # the lie took
                assert timing["used_ms"] >= 0.85 * calls.p25_ms, (timing, calls)  # and gained next to nothing
            judge(attack, bad, good)
            return
        except AssertionError:
            if attempt == 2:
                raise


def test_a_clock_slowed_well_past_the_noise_is_suspect_on_every_measurement(build_cache):
    """The same runner on an input sixteen times the usual (about 4 ms a call on one core): what it hides (60%)
    is beyond the hidden-time check's allowance, so the run is flagged, measured again in a fresh runner, flagged
    again, and `suspect`; the first measurement is kept in the verdict."""
    from kevin_exp.bench import CheckRules
    from tests.adversarial.attacks import PROBLEM, config
    from tests.adversarial.conftest import evaluate_attacks

    problem = PROBLEM.replace('{"M": 256, "N": 2048}', '{"M": 4096, "N": 2048}')
    assert problem != PROBLEM
    attack = Attack("slowed_clock_hiding_milliseconds", SLOW_CLOCK, stopped("suspect"), gain=True, problem=problem)
    cfg = config(build_cache, rules=CheckRules(restrict_imports=False), forbid_new_tasks=False, hidden_time_retries=1)
    bad, good = evaluate_attacks([attack], cfg)[attack.name]
    judge(attack, bad, good)
    assert bad.rule == "hidden_time", bad.reason
    assert len(bad.extra["remeasured"]) == 1 and bad.extra["remeasured"][0]["hidden_ms"] > 1.0, bad.extra


def test_a_lying_runner_that_keeps_the_cpus_busy_is_not_accused_but_gains_nothing(build_cache):
    """What the hidden-time check does not stop: the slowed clock, with threads that keep the CPUs contended from
    the moment the candidate loads. Load that came after the calibration stretches an honest runner's path as
    much, so the run is not accused (it is measured again, with the same result); its speedup still takes the
    outside clock's bound, which holds it to its honest twin's (within the attacks' gain bound). Where the kernel
    gives no CPU pressure, the check cannot tell load from lies and accuses as before. (The static rules refuse
    the threads by default, ``no_concurrency``: this is the check alone, past them.)"""
    from kevin_exp.bench import CheckRules, cpu_pressure
    from tests.adversarial.attacks import PROBLEM, config
    from tests.adversarial.conftest import evaluate_attacks

    problem = PROBLEM.replace('{"M": 256, "N": 2048}', '{"M": 4096, "N": 2048}')
    attack = Attack("slowed_clock_under_its_own_load", SLOW_CLOCK_UNDER_ITS_OWN_LOAD, stopped("suspect"), gain=True,
                    problem=problem)
    cfg = config(build_cache, rules=CheckRules(restrict_imports=False, no_concurrency=False), forbid_new_tasks=False,
                 hidden_time_retries=1)
    bad, good = evaluate_attacks([attack], cfg)[attack.name]
    if cpu_pressure.stall_us() is None:
        assert bad.rule == "hidden_time", bad.reason
        return
    assert bad.status.value == "ok", bad.reason
    assert "hidden_time_inconclusive" in bad.extra and len(bad.extra["remeasured"]) == 1, bad.extra
    contention = bad.extra["contention"]
    assert contention["trials"] - contention["calibration"] > cfg.hidden_time_contention, contention
    assert bad.extra["timing"]["used"] == "outside_bound", bad.extra["timing"]
    judge(attack, bad, good)
