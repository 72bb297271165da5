"""The runner's filter past new tasks: once installed, a call that would let code run after the harness's calls
(signal handlers, timers, signal-driven descriptors, userfaultfd, io_uring) or write code (executable memory that
is writable or anonymous, mprotect to executable, ptrace, /proc/self/mem made reachable again, new namespaces)
ends the process with SIGSYS; what Python and torch still need passes.

Each refused call runs in a fresh Python process (the filter cannot be removed, and the call ends it)."""
from __future__ import annotations

import json
import platform
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kevin_exp.bench import seccomp, seccomp_rules

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() != "x86_64",
                                reason="the calls below are made by x86_64 number")

PRELUDE = """
import ctypes, faulthandler, json, mmap, os, sys
faulthandler.enable()  # as the runner does, before the filter
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
def sc(nr, *args):
    return libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
buf = ctypes.create_string_buffer(256)
act = ctypes.create_string_buffer((0x401000).to_bytes(8, "little") + bytes(248))  # a handler at an address
page = libc.mmap(None, 4096, 3, 0x22, -1, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS
from kevin_exp.bench import seccomp
from kevin_exp.bench import runtime_guard
reporter = ctypes.CDLL(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None
if reporter is None:
    runtime_guard.loaded_op_watch = lambda: None  # no trap handler: refused calls kill outright
how = seccomp.forbid_new_tasks(reporter)
print("filtered", how, flush=True)
"""

# name -> the refused call, as Python source run after the filter
REFUSED: dict[str, str] = {
    "rt_sigaction": "sc(13, 14, act, None, 8)",  # SIGALRM with a handler
    "setitimer": "sc(38, 0, buf, None)",
    "alarm": "sc(37, 1)",
    "timer_create": "sc(222, 1, None, buf)",
    "timer_settime": "sc(223, 0, 0, buf, None)",
    "fcntl O_ASYNC": "r, w = os.pipe(); sc(72, r, 4, 0o20000 | 0o4000)",  # F_SETFL, O_ASYNC|O_NONBLOCK
    "fcntl F_SETSIG": "r, w = os.pipe(); sc(72, r, 10, 29)",
    "fcntl F_SETOWN": "r, w = os.pipe(); sc(72, r, 8, os.getpid())",
    "fcntl F_SETOWN_EX": "r, w = os.pipe(); sc(72, r, 15, buf)",
    "ioctl FIOASYNC": "r, w = os.pipe(); sc(16, r, 0x5452, buf)",
    "userfaultfd": "sc(323, 0)",
    "ptrace": "sc(101, 0, 0, 0, 0)",
    "process_vm_writev": "sc(311, os.getpid(), buf, 1, buf, 1, 0)",
    "memfd_create": "sc(319, b'x', 0)",
    "io_uring_setup": "sc(425, 4, buf)",
    "mprotect exec": "sc(10, page, 4096, 5)",  # PROT_READ|PROT_EXEC
    "pkey_mprotect exec": "sc(329, page, 4096, 7, -1)",
    "mmap anonymous exec": "libc.mmap(None, 4096, 5, 0x22, -1, 0)",
    "mmap writable exec": "fd = os.open(sys.executable, os.O_RDONLY); libc.mmap(None, 4096, 7, 2, fd, 0)",
    "mremap fixed": "sc(25, page, 4096, 4096, 3, page + 1 << 20)",  # MREMAP_MAYMOVE|MREMAP_FIXED
    "shmat exec": "sc(30, 0, 0, 0o100000)",
    "personality READ_IMPLIES_EXEC": "sc(135, 0x0400000)",
    "prctl dumpable": "sc(157, 4, 1, 0, 0, 0)",
    "unshare": "sc(272, 0x10000000)",  # CLONE_NEWUSER
    "perf_event_open": "sc(298, buf, 0, -1, -1, 0)",
}

ALLOWED = """
out = {}
out["sigaction query"] = sc(13, 14, None, buf, 8)
r, w = os.pipe()
out["fcntl F_GETFL"] = sc(72, r, 3) >= 0
out["fcntl F_SETFL O_NONBLOCK"] = sc(72, r, 4, 0o4000)
out["ioctl FIONREAD"] = sc(16, r, 0x541B, buf)
fd = os.open(sys.executable, os.O_RDONLY)
out["mmap file exec"] = libc.mmap(None, 4096, 5, 2, fd, 0) not in (None, 2**64 - 1)
out["mmap anonymous rw"] = libc.mmap(None, 4096, 3, 0x22, -1, 0) not in (None, 2**64 - 1)
out["mprotect read"] = sc(10, page, 4096, 1)
out["mremap grow"] = sc(25, page, 4096, 8192, 1) > 0  # MREMAP_MAYMOVE
out["personality query"] = sc(135, 0xFFFFFFFF) >= 0
out["dumpable"] = sc(157, 3, 0, 0, 0, 0)
import _decimal, hashlib  # extension modules loaded after the filter (dlopen: file-backed executable maps)
out["dlopen"] = hashlib.sha256(b"x").hexdigest()[:8]
m = mmap.mmap(-1, 1 << 16)
m[:4] = b"abcd"
out["python mmap"] = m[:4].decode()
print(json.dumps(out))
os._exit(0)  # the interpreter's teardown restores signal handlers, which the filter refuses
"""


def _run(body: str, reporter: str = "") -> subprocess.CompletedProcess:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, reporter], capture_output=True, text=True, timeout=120)


def test_what_python_and_the_runner_need_passes_under_the_filter() -> None:
    proc = _run(ALLOWED)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"sigaction query": 0, "fcntl F_GETFL": True, "fcntl F_SETFL O_NONBLOCK": 0, "ioctl FIONREAD": 0,
                   "mmap file exec": True, "mmap anonymous rw": True, "mprotect read": 0, "mremap grow": True,
                   "personality query": True, "dumpable": 0, "dlopen": "2d711642", "python mmap": "abcd"}, out


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refused_call_ends_the_process_with_sigsys(name: str) -> None:
    proc = _run(REFUSED[name] + "\nprint('survived', flush=True)\n")
    assert "filtered kill" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGSYS and "survived" not in proc.stdout, (name, proc.returncode, proc.stdout,
                                                                                 proc.stderr)


def test_the_trap_handler_names_the_refused_call(build_cache: Path) -> None:
    """With the op watch library loaded, the process still dies by SIGSYS, and says which call and why first."""
    from kevin_exp.bench.build import op_watch

    lib, what = op_watch.build(build_cache)
    assert lib is not None, what
    for body, name in (("sc(13, 14, act, None, 8)", "rt_sigaction"), ("sc(10, page, 4096, 7)", "mprotect"),
                       ("r, w = os.pipe(); sc(72, r, 4, 0o20000)", "fcntl")):
        proc = _run(body + "\nprint('survived', flush=True)\n", str(lib))
        assert "filtered trap" in proc.stdout, proc.stdout + proc.stderr
        assert proc.returncode == 128 + signal.SIGSYS and "survived" not in proc.stdout, (proc.stdout, proc.stderr)
        assert f"forbidden system call {name} ({seccomp_rules.why(name)})" in proc.stderr, proc.stderr


def test_every_rule_names_a_known_call_and_the_program_jumps_only_forward() -> None:
    for arch in seccomp._ARCHES.values():
        for action in (seccomp.SECCOMP_RET_TRAP, seccomp.SECCOMP_RET_KILL_PROCESS):
            assert len(seccomp.filter_program(arch, action)) < 256  # assembled: every jump fits, forward
    assert all(r.syscall in seccomp_rules.NUMBERS and r.why for r in seccomp_rules.RULES)


def test_a_fatal_signal_after_the_filter_ends_as_that_signal(build_cache: Path) -> None:
    """Python's faulthandler prints its traceback, then puts the default action back (a refused rt_sigaction): the
    trap handler ends the process as the signal would have (exit status 128 + signal, which the parent reads as
    the signal), without calling it a forbidden call."""
    from kevin_exp.bench.build import op_watch

    lib, what = op_watch.build(build_cache)
    assert lib is not None, what
    proc = _run("ctypes.string_at(0)\n", str(lib))
    assert "filtered trap" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 128 + signal.SIGSEGV, (proc.returncode, proc.stderr)
    assert "Segmentation fault" in proc.stderr and "forbidden system call" not in proc.stderr, proc.stderr
