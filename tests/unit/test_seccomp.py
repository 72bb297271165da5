"""forbid_new_tasks(): after it, a process cannot start threads or processes nor exec, and keeps running.

Each case runs in a fresh Python process (the filter cannot be removed once installed)."""
from __future__ import annotations

import json
import platform
import struct
import subprocess
import sys
import textwrap

import pytest

from kevin_exp.bench import seccomp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
                                reason="seccomp filters are defined for Linux on x86_64 and aarch64")

PRELUDE = """
import json, os, subprocess, sys, threading
import torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
warm = a @ a  # the intra-op pool starts here, before the filter
from kevin_exp.bench.seccomp import forbid_new_tasks, tasks_forbidden
before = tasks_forbidden()
forbid_new_tasks()
out = {"before": before, "after": tasks_forbidden()}
"""


def run_filtered(body: str) -> dict:
    # os._exit: the interpreter's teardown restores signal handlers, which the filter refuses (SIGSYS)
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out), flush=True)\nos._exit(0)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] is False and out["after"] is True
    return out


def test_threads_processes_and_exec_fail_and_the_process_goes_on() -> None:
    out = run_filtered("""
        def attempt(name, fn):
            try:
                fn()
                out[name] = "ran"
            except Exception as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
        attempt("thread", lambda: threading.Thread(target=lambda: None).start())
        def fork():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        attempt("fork", fork)
        attempt("subprocess", lambda: subprocess.run(["true"], check=True))
        attempt("posix_spawn", lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0))
        attempt("exec", lambda: os.execv("/bin/true", ["true"]))
        out["alive"] = True
    """)
    assert out["thread"].startswith("RuntimeError") and "thread" in out["thread"]
    for name in ("fork", "subprocess", "posix_spawn", "exec"):
        assert "Operation not permitted" in out[name] and out[name].startswith(("OSError", "PermissionError")), out
    assert out["alive"] is True


def test_torch_keeps_its_started_thread_pool() -> None:
    out = run_filtered("""
        b = torch.randn(1024, 1024)
        c = b @ b
        out["threads"] = torch.get_num_threads()
        out["close"] = bool(torch.allclose(c, (b.double() @ b.double()).float(), atol=1e-2, rtol=1e-3))
        out["parallel_sum"] = float(torch.ones(1 << 22).sum())
    """)
    assert out["threads"] == 2 and out["close"] is True and out["parallel_sum"] == float(1 << 22)


def test_the_filter_checks_the_architecture_first() -> None:
    """The first instructions load the arch field and send any other ABI's calls to the refusal."""
    for name, arch in seccomp._ARCHES.items():
        prog = seccomp.filter_program(arch)
        code, jt, jf, k = struct.unpack("=HBBI", prog[0])
        assert (code, k) == (0x20, 4), name  # BPF_LD|BPF_W|BPF_ABS of seccomp_data.arch
        code, jt, jf, k = struct.unpack("=HBBI", prog[1])
        assert k == arch.audit_arch and jt == 0
        target = prog[2 + jf]
        assert struct.unpack("=HBBI", target)[3] == 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM


def test_unknown_architecture_is_refused_before_anything_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    with pytest.raises(seccomp.SeccompUnavailable, match="riscv64"):
        seccomp.forbid_new_tasks()
    assert not seccomp.tasks_forbidden()
