"""A worker that has loaded candidate code may not create threads or processes, nor exec programs.

``forbid_new_tasks()`` is called by the candidate's worker after its warm-up (torch imported, its thread
pools started, the CUDA context up) and before the candidate's code is loaded. It installs a seccomp-BPF
filter on every thread of the process (``SECCOMP_FILTER_FLAG_TSYNC``) that makes ``clone``, ``fork``,
``vfork``, ``execve`` and ``execveat`` fail with EPERM and ``clone3`` fail with ENOSYS (so libc falls back to
``clone``, which is then refused). Failing calls, not killing the process: ``threading.Thread.start()``
raises ``RuntimeError``, ``os.fork()`` and ``subprocess.run`` raise ``OSError``, a C++ ``std::thread`` throws
``std::system_error``; the worker survives and reports the candidate's failure as its verdict. Threads that
exist already (torch's intra-op pool, CUDA's) keep running. The filter cannot be removed, and every child
would inherit it (there can be none).

The filter is written here as raw BPF: it checks the architecture of each system call first, so a syscall
made through another ABI (``int 0x80`` or the x32 ABI on x86_64, whose numbers differ) is refused outright
rather than matched against the wrong numbers.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys
from dataclasses import dataclass

# linux/audit.h
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_AARCH64 = 0xC00000B7
# linux/prctl.h, linux/seccomp.h
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
# linux/bpf_common.h
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
_BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
_BPF_JMP_JGE_K = 0x05 | 0x30 | 0x00
_BPF_RET_K = 0x06 | 0x00
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6];
_OFFSET_NR = 0
_OFFSET_ARCH = 4
_X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class _Arch:
    audit_arch: int
    seccomp_nr: int
    refused: dict[str, int]  # name -> syscall number, failing with EPERM
    clone3: int  # fails with ENOSYS
    has_x32: bool = False


_ARCHES: dict[str, _Arch] = {
    # arch/x86/entry/syscalls/syscall_64.tbl
    "x86_64": _Arch(_AUDIT_ARCH_X86_64, 317, {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322},
                    clone3=435, has_x32=True),
    # include/uapi/asm-generic/unistd.h (aarch64 has no fork or vfork system calls)
    "aarch64": _Arch(_AUDIT_ARCH_AARCH64, 277, {"clone": 220, "execve": 221, "execveat": 281}, clone3=435),
}


class SeccompUnavailable(RuntimeError):
    """The filter cannot be installed here (unknown architecture, a kernel without seccomp filters)."""


def _arch() -> _Arch:
    machine = platform.machine()
    arch = _ARCHES.get({"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine))
    if arch is None:
        raise SeccompUnavailable(
            f"forbid_new_tasks: no seccomp filter is defined for the CPU architecture {machine!r} (known: "
            f"{', '.join(_ARCHES)}); its system call numbers must be added to kevin_exp.bench.seccomp before candidates run here")
    return arch


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(arch: _Arch) -> list[bytes]:
    """The BPF program, one 8-byte instruction per element."""
    eperm = _SECCOMP_RET_ERRNO | errno.EPERM
    enosys = _SECCOMP_RET_ERRNO | errno.ENOSYS
    checks: list[tuple[int, int]] = [(nr, eperm) for nr in arch.refused.values()] + [(arch.clone3, enosys)]
    prog = [_insn(_BPF_LD_W_ABS, _OFFSET_ARCH)]
    # Another ABI's system call: refuse it (its numbers mean something else). Jump offsets count from the next insn.
    body_len = 1 + (1 if arch.has_x32 else 0) + 2 * len(checks) + 1
    prog.append(_insn(_BPF_JMP_JEQ_K, arch.audit_arch, jt=0, jf=body_len))
    prog.append(_insn(_BPF_LD_W_ABS, _OFFSET_NR))
    if arch.has_x32:
        # x32 system calls carry this bit and reach the same handlers (x32 clone is 56 | bit)
        prog.append(_insn(_BPF_JMP_JGE_K, _X32_SYSCALL_BIT, jt=2 * len(checks) + 1, jf=0))
    for nr, action in checks:
        prog.append(_insn(_BPF_JMP_JEQ_K, nr, jt=0, jf=1))
        prog.append(_insn(_BPF_RET_K, action))
    prog.append(_insn(_BPF_RET_K, _SECCOMP_RET_ALLOW))
    prog.append(_insn(_BPF_RET_K, eperm))
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def start_thread_pools() -> None:
    """Start torch's intra-op thread pool (OpenMP's team, which MKL shares) at its full size.

    Its threads are created lazily, on the first parallel region that asks for them; one created after
    the filter fails, and libgomp then ends the whole process ("Thread creation failed").
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    threads = torch.get_num_threads()
    if threads > 1:
        # at::parallel_for asks for min(threads, elements / 32768) threads: enough elements for all of them
        torch.ones(threads * (1 << 16)).sum()
        a = torch.ones(256, 256)
        torch.mm(a, a)


def forbid_new_tasks() -> None:
    """Install the filter on the calling process (inherited by every thread it already has).

    Starts torch's thread pool first if torch is imported. Raises ``SeccompUnavailable`` if the filter
    cannot be installed on every thread; never installs a partial filter.
    """
    arch = _arch()
    start_thread_pools()
    code = b"".join(filter_program(arch))
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompUnavailable(f"forbid_new_tasks: prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(arch.seccomp_nr), ctypes.c_uint(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_uint(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc < 0:
        err = ctypes.get_errno()
        raise SeccompUnavailable(f"forbid_new_tasks: seccomp(SECCOMP_SET_MODE_FILTER, TSYNC) failed: {os.strerror(err)}")
    if rc > 0:
        # TSYNC names a thread that could not take the filter; nothing was installed
        raise SeccompUnavailable(f"forbid_new_tasks: thread {rc} could not take the seccomp filter; nothing was installed")


def tasks_forbidden() -> bool:
    """Whether this process runs under a seccomp filter (this one, or one installed before)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return line.split()[1] == "2"
    except OSError:
        pass
    return False
