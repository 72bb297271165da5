"""Class 2 (work after the clock, code that is written): the parent's clock brackets "go" to "ran"; what the runner
does after "ran" is free. A kernel that returns an empty output and has it filled later (by a SIGALRM handler on
a timer, by a SIGIO handler when the next request arrives on the runner's request pipe, the handler installed
with raw system calls written as machine code) is timed at nothing. A kernel that rewrites libc's clock (made
writable with mprotect, written through /proc/self/mem, a page written to /tmp or into the shared exchange and
mapped over libc's) reports less than it takes.

Stopped by the runner's seccomp filter (``seccomp.py``, ``seccomp_rules.py``: signal handlers, timers,
signal-driven descriptors and executable memory that is writable or anonymous end the process with SIGSYS, its
trap handler naming the call), ``noexec`` on every writable mount of the worker's jail, the exchange's descriptor
closed before candidate code loads, and the process made non-dumpable (``/proc/self/mem`` is root's).

Several attacks need spellings the static rules refuse (``asm("syscall")``, ``mprotect``, ``mmap``, files): the
module runs with those rules off (``restrict_imports=False``), so what stops them is the runtime; the two
signal attacks pass the static rules as written (``test_the_signal_attacks_pass_the_static_rules``)."""
from __future__ import annotations

import platform

import pytest

from kevin_exp.bench import CheckRules
from tests.adversarial.attacks import Attack, candidate, judge, stopped
from tests.adversarial.test_recheck import _SLOW_CLOCK_CPP

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the attacks' machine code is x86_64")

CONFIG = {"rules": CheckRules(restrict_imports=False), "compile_timeout_s": 600}  # a busy box compiles slowly

LEAKY_INTO = r"""
static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}
"""

# The call only records where its work is; a handler does it later, on the runner's main thread.
_LATER = LEAKY_INTO + r"""
#include <csignal>
#include <cstring>

static torch::Tensor held_in, held_out;
static volatile sig_atomic_t pending = 0;
static long finished = 0;

static void finish(int) {
    if (!pending) return;
    leaky_into(held_in.data_ptr<float>(), held_out.data_ptr<float>(), held_in.numel());
    pending = 0;
    ++finished;
}

static void later(torch::Tensor& xc, torch::Tensor& out) {
    held_in = xc;
    held_out = out;
    pending = 1;
}
"""

# (a) a SIGALRM handler, a one-shot timer 40 us after the call returned (<csignal> declares setitimer)
SIGALRM_TIMER = candidate(_LATER + r"""

torch::Tensor leaky(torch::Tensor x) {
    static bool armed = false;
    if (!armed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = finish;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, nullptr);
        armed = true;
    }
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    later(xc, out);
    itimerval t{};
    t.it_value.tv_usec = 40;  // after "ran" is written, before the harness reads "collect"
    setitimer(ITIMER_REAL, &t, nullptr);
    return out;
}
""", name="adv_sigalrm_timer")

# (b) O_ASYNC on the runner's request pipe (stdin): SIGIO arrives with the next request ("collect"), before the
# harness reads it, so the output is complete when it is written out
SIGIO_ON_REQUESTS = candidate(_LATER + r"""
#include <unistd.h>
extern "C" int fcntl(int fd, int cmd, ...);

torch::Tensor leaky(torch::Tensor x) {
    static bool armed = false;
    if (!armed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = finish;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGIO, &sa, nullptr);
        fcntl(0, 8, getpid());                       // F_SETOWN
        fcntl(0, 4, fcntl(0, 3) | 020000);           // F_SETFL: F_GETFL | O_ASYNC
        armed = true;
    }
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    later(xc, out);
    return out;
}
""", name="adv_sigio_requests")

# (c) the same timer attack with the handler installed and the timer armed by raw system calls (rt_sigaction,
# setitimer), written as machine code: no libc function a rule could name
RAW_SYSCALL_TIMER = candidate(_LATER + r"""
static long raw4(long nr, long a, long b, long c, long d) {
    long ret;
    register long r10 asm("r10") = d;
    asm volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return ret;
}

__attribute__((naked)) static void restorer() { asm volatile("mov $15, %eax\n\tsyscall"); }

struct kx_sigaction { void (*handler)(int); unsigned long flags; void (*restorer)(); unsigned long mask; };

torch::Tensor leaky(torch::Tensor x) {
    static bool armed = false;
    if (!armed) {
        kx_sigaction sa{finish, 0x04000000UL | 0x10000000UL, restorer, 0};  // SA_RESTORER | SA_RESTART
        TORCH_CHECK(raw4(13, SIGALRM, (long)&sa, 0, 8) == 0, "rt_sigaction refused");
        armed = true;
    }
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    later(xc, out);
    long t[4] = {0, 0, 0, 40};
    raw4(38, 0, (long)t, 0, 0);
    return out;
}
""", name="adv_raw_syscall_timer")


def _with_overwrite(body: str) -> str:
    """The slowed clock of test_recheck with another way of writing libc's page."""
    start = _SLOW_CLOCK_CPP.index("static bool overwrite(")
    end = _SLOW_CLOCK_CPP.index("int slow_down()")
    head = _SLOW_CLOCK_CPP[:start].replace('extern "C" int pkey_mprotect(void* addr, size_t len, int prot, int pkey);', "")
    return head + body + "\n" + _SLOW_CLOCK_CPP[end:]


def _slow_clock(cpp: str, name: str) -> str:
    return candidate(cpp, name=name, functions=("slow_down", "leaky"), prelude="ext.slow_down()\n")


# (d) libc's clock_gettime made writable (mprotect, read-write-execute) and patched
PATCH_BY_MPROTECT = _slow_clock(_with_overwrite(r"""
#include <sys/mman.h>
static bool overwrite(void* where, const unsigned char* code, size_t len) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    void* first = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(where) & ~(page - 1));
    if (mprotect(first, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return false;
    memcpy(where, code, len);
    return true;
}
"""), "adv_patch_mprotect")

# (d) the same patch written through /proc/self/mem (which writes through page protections)
PATCH_BY_PROC_MEM = _slow_clock(_with_overwrite(r"""
static bool overwrite(void* where, const unsigned char* code, size_t len) {
    int fd = open("/proc/self/mem", O_RDWR);
    if (fd < 0) return false;
    bool done = pwrite(fd, code, len, (off_t)reinterpret_cast<uintptr_t>(where)) == (ssize_t)len;
    close(fd);
    return done;
}
"""), "adv_patch_proc_mem")

_PAGE_COPY = r"""
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <vector>

// libc's two pages around `where`, patched, in a file; the file mapped over them (MAP_FIXED, read + execute)
static bool map_patched_copy(int fd, off_t offset, void* where, const unsigned char* code, size_t len) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t first = reinterpret_cast<uintptr_t>(where) & ~(page - 1);
    std::vector<unsigned char> copy(reinterpret_cast<unsigned char*>(first), reinterpret_cast<unsigned char*>(first) + 2 * page);
    memcpy(copy.data() + (reinterpret_cast<uintptr_t>(where) - first), code, len);
    if (pwrite(fd, copy.data(), copy.size(), offset) != (ssize_t)copy.size()) return false;
    void* m = mmap(reinterpret_cast<void*>(first), 2 * page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, offset);
    return m == reinterpret_cast<void*>(first);
}
"""

# (e) the patched page written to a file in the runner's own /tmp (its work folder) and mapped over libc's
PAGE_FROM_TMP = _slow_clock(_with_overwrite(_PAGE_COPY + r"""
static bool overwrite(void* where, const unsigned char* code, size_t len) {
    const char* dir = getenv("TMPDIR");
    std::string path = std::string(dir ? dir : "/tmp") + "/kx-page";
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0700);
    if (fd < 0) return false;
    bool done = map_patched_copy(fd, 0, where, code, len);
    close(fd);
    return done;
}
"""), "adv_page_from_tmp")

# (e') the next try against noexec: the shared exchange (a memfd, on no noexec mount) grown by two pages that hold
# the patched copy, mapped over libc's
PAGE_FROM_EXCHANGE = _slow_clock(_with_overwrite(_PAGE_COPY + r"""
static bool overwrite(void* where, const unsigned char* code, size_t len) {
    const long page = sysconf(_SC_PAGESIZE);
    for (int fd = 3; fd < 256; ++fd) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR) continue;
        off_t end = (st.st_size + page - 1) / page * page;
        if (ftruncate(fd, end + 2 * page) != 0) continue;
        if (map_patched_copy(fd, end, where, code, len)) return true;
    }
    return false;
}
"""), "adv_page_from_exchange")

# (e'') and a memfd of its own
PAGE_FROM_MEMFD = _slow_clock(_with_overwrite(_PAGE_COPY + r"""
static bool overwrite(void* where, const unsigned char* code, size_t len) {
    int fd = memfd_create("kx", 0);
    if (fd < 0) return false;
    bool done = map_patched_copy(fd, 0, where, code, len);
    close(fd);
    return done;
}
"""), "adv_page_from_memfd")

_REFUSED = stopped("crashed", "forbidden")
_PATCH_REFUSED = stopped("crashed", "forbidden", "runtime_error")  # runtime_error: the patch did not take

ATTACKS = [
    Attack("sigalrm_timer_finishes_after_ran", SIGALRM_TIMER, _REFUSED, gain=True),
    Attack("sigio_on_the_request_pipe_finishes_at_collect", SIGIO_ON_REQUESTS, _REFUSED, gain=True),
    Attack("raw_syscall_handler_and_timer", RAW_SYSCALL_TIMER, _REFUSED, gain=True),
    Attack("clock_patched_through_mprotect", PATCH_BY_MPROTECT, _REFUSED),
    Attack("clock_patched_through_proc_self_mem", PATCH_BY_PROC_MEM, _PATCH_REFUSED),
    Attack("clock_page_mapped_from_a_file_in_tmp", PAGE_FROM_TMP, _PATCH_REFUSED),
    Attack("clock_page_mapped_from_the_exchange", PAGE_FROM_EXCHANGE, _PATCH_REFUSED),
    Attack("clock_page_mapped_from_a_memfd", PAGE_FROM_MEMFD, _REFUSED),
]

# what each attack's verdict must say once stopped (crashed: the trap handler's message in the feedback)
NAMED = {
    "sigalrm_timer_finishes_after_ran": "rt_sigaction", "sigio_on_the_request_pipe_finishes_at_collect": "rt_sigaction",
    "raw_syscall_handler_and_timer": "rt_sigaction", "clock_patched_through_mprotect": "mprotect",
    "clock_page_mapped_from_a_memfd": "memfd_create",
}


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_stopped(attack, verdicts):
    judge(attack, *verdicts[attack.name], again=verdicts.again(attack))
    bad, _ = verdicts[attack.name]
    if attack.name in NAMED:
        assert bad.status.value == "crashed" and "SIGSYS" in bad.reason, (bad.status, bad.reason)
        assert f"forbidden system call {NAMED[attack.name]}" in bad.feedback, bad.feedback


def test_the_signal_attacks_pass_the_static_rules():
    """(a) and (b) are written with names the native rules allow: only the runtime stops them."""
    import ast

    from kevin_exp.bench.candidate_source import extract_specs
    from kevin_exp.bench.checks.native import native_violations

    for source in (SIGALRM_TIMER, SIGIO_ON_REQUESTS):
        specs = extract_specs(ast.parse(source)).specs
        assert len(specs) == 1
        assert native_violations(specs[0], "cpu", CheckRules()) == [], specs[0].name
