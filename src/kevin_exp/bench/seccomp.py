"""A worker that has loaded candidate code may not create threads or processes, nor exec programs, nor arrange
for code to run outside the calls the harness makes, nor write code.

``forbid_new_tasks()`` is called by the candidate's worker after its warm-up (torch imported, its thread
pools started, the CUDA context up) and before the candidate's code is loaded. It installs a seccomp-BPF
filter on every thread of the process (``SECCOMP_FILTER_FLAG_TSYNC``) that makes ``clone``, ``fork``,
``vfork``, ``execve`` and ``execveat`` fail with EPERM and ``clone3`` fail with ENOSYS (so libc falls back to
``clone``, which is then refused). Failing calls, not killing the process: ``threading.Thread.start()``
raises ``RuntimeError``, ``os.fork()`` and ``subprocess.run`` raise ``OSError``, a C++ ``std::thread`` throws
``std::system_error``; the worker survives and reports the candidate's failure as its verdict. Threads that
exist already (torch's intra-op pool, CUDA's) keep running. The filter cannot be removed, and every child
would inherit it (there can be none).

The same filter refuses what ``seccomp_rules`` lists: signal handlers, timers and signal-driven descriptors
(work done after the runner reported "ran"), and executable memory that is writable or anonymous, code made
writable, ``/proc/self/mem`` made accessible again (the process is made non-dumpable first), ``ptrace`` and the
like (rewriting the clock or the harness). Those calls end the process: with the trusted trap handler of the op
watch library (``build/op_watch.py``) loaded, ``SECCOMP_RET_TRAP`` and a message on stderr that names the call,
then exit status 128 + SIGSYS (the parent reads it as SIGSYS); without it, ``SECCOMP_RET_KILL_PROCESS``. Either
way the verdict is ``crashed`` (killed by SIGSYS), with the message in the feedback.

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
from typing import Any

from kevin_exp.bench import seccomp_rules as R

# linux/audit.h
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_AARCH64 = 0xC00000B7
# linux/prctl.h, linux/seccomp.h
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_TRAP = 0x00030000
SECCOMP_RET_KILL_PROCESS = 0x80000000
# linux/bpf_common.h
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
_BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
_BPF_JMP_JGE_K = 0x05 | 0x30 | 0x00
_BPF_JMP_JSET_K = 0x05 | 0x40 | 0x00
_BPF_RET_K = 0x06 | 0x00
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; (little-endian: low word first)
_OFFSET_NR = 0
_OFFSET_ARCH = 4
_OFFSET_ARGS = 16
_X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class _Arch:
    machine: str
    audit_arch: int
    seccomp_nr: int
    refused: dict[str, int]  # name -> syscall number, failing with EPERM
    clone3: int  # fails with ENOSYS
    has_x32: bool = False


_ARCHES: dict[str, _Arch] = {
    # arch/x86/entry/syscalls/syscall_64.tbl
    "x86_64": _Arch("x86_64", _AUDIT_ARCH_X86_64, 317,
                    {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322}, clone3=435, has_x32=True),
    # include/uapi/asm-generic/unistd.h (aarch64 has no fork or vfork system calls)
    "aarch64": _Arch("aarch64", _AUDIT_ARCH_AARCH64, 277, {"clone": 220, "execve": 221, "execveat": 281}, clone3=435),
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


class _Program:
    """BPF with symbolic jump targets: a target is 0 (the next instruction) or a label placed later."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, int | str, int | str]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        self.code.append((code, k, jt, jf))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def load_arg_low(self, i: int) -> None:
        self.op(_BPF_LD_W_ABS, _OFFSET_ARGS + 8 * i)

    def assemble(self) -> list[bytes]:
        out = []
        for at, (code, k, jt, jf) in enumerate(self.code):
            offsets = [t if isinstance(t, int) else self.labels[t] - at - 1 for t in (jt, jf)]
            assert all(0 <= o < 256 for o in offsets), (at, offsets)
            out.append(_insn(code, k, *offsets))
        return out


def filter_program(arch: _Arch, code_action: int = SECCOMP_RET_KILL_PROCESS) -> list[bytes]:
    """The BPF program, one 8-byte instruction per element. ``code_action`` is what a call of
    ``seccomp_rules`` gets when its arguments are refused."""
    eperm = _SECCOMP_RET_ERRNO | errno.EPERM
    p = _Program()
    p.op(_BPF_LD_W_ABS, _OFFSET_ARCH)
    # Another ABI's system call: refuse it (its numbers mean something else).
    p.op(_BPF_JMP_JEQ_K, arch.audit_arch, jt=0, jf="eperm")
    p.op(_BPF_LD_W_ABS, _OFFSET_NR)
    if arch.has_x32:
        # x32 system calls carry this bit and reach the same handlers (x32 clone is 56 | bit)
        p.op(_BPF_JMP_JGE_K, _X32_SYSCALL_BIT, jt="eperm")
    for nr in arch.refused.values():
        p.op(_BPF_JMP_JEQ_K, nr, jt="eperm")
    p.op(_BPF_JMP_JEQ_K, arch.clone3, jt="enosys")
    rules = [(r, R.number(r.syscall, arch.machine)) for r in R.RULES]
    rules = [(r, nr) for r, nr in rules if nr is not None]
    for i, (rule, nr) in enumerate(rules):
        p.op(_BPF_JMP_JEQ_K, nr, jt=f"rule{i}")
    p.op(_BPF_JMP_JEQ_K, R.number("mmap", arch.machine), jt="mmap")
    p.op(_BPF_JMP_JEQ_K, R.number("fcntl", arch.machine), jt="fcntl")
    p.op(_BPF_RET_K, _SECCOMP_RET_ALLOW)
    for i, (rule, _) in enumerate(rules):
        p.label(f"rule{i}")
        if rule.kind == "always":
            p.op(_BPF_RET_K, code_action)
        elif rule.kind == "nonzero":  # a 64-bit pointer: both words
            p.load_arg_low(rule.arg)
            p.op(_BPF_JMP_JEQ_K, 0, jt=0, jf="deny")
            p.op(_BPF_LD_W_ABS, _OFFSET_ARGS + 8 * rule.arg + 4)
            p.op(_BPF_JMP_JEQ_K, 0, jt="allow", jf="deny")
        elif rule.kind == "bits":
            p.load_arg_low(rule.arg)
            p.op(_BPF_JMP_JSET_K, rule.values[0], jt="deny", jf="allow")
        elif rule.kind == "one_of":
            p.load_arg_low(rule.arg)
            for v in rule.values:
                p.op(_BPF_JMP_JEQ_K, v, jt="deny")
            p.op(_BPF_RET_K, _SECCOMP_RET_ALLOW)
        elif rule.kind == "not":
            p.load_arg_low(rule.arg)
            p.op(_BPF_JMP_JEQ_K, rule.values[0], jt="allow", jf="deny")
        else:  # pragma: no cover - a table error
            raise ValueError(rule.kind)
    # mmap(addr, len, prot, flags, fd, off): executable and (writable or anonymous) is refused
    p.label("mmap")
    p.load_arg_low(2)
    p.op(_BPF_JMP_JSET_K, R.PROT_EXEC, jt=0, jf="allow")
    p.op(_BPF_JMP_JSET_K, R.PROT_WRITE, jt="deny")
    p.load_arg_low(3)
    p.op(_BPF_JMP_JSET_K, R.MAP_ANONYMOUS, jt="deny", jf="allow")
    # fcntl(fd, cmd, arg): F_SETFL with O_ASYNC, and the commands that choose who gets signals
    p.label("fcntl")
    p.load_arg_low(1)
    p.op(_BPF_JMP_JEQ_K, R.F_SETFL, jt=0, jf="fcntl_other")
    p.load_arg_low(2)
    p.op(_BPF_JMP_JSET_K, R.O_ASYNC, jt="deny", jf="allow")
    p.label("fcntl_other")
    for cmd in R.FCNTL_SIGNAL_CMDS:
        p.op(_BPF_JMP_JEQ_K, cmd, jt="deny")
    # the shared ends (BPF jumps only forward)
    p.label("allow")
    p.op(_BPF_RET_K, _SECCOMP_RET_ALLOW)
    p.label("eperm")
    p.op(_BPF_RET_K, eperm)
    p.label("enosys")
    p.op(_BPF_RET_K, _SECCOMP_RET_ERRNO | errno.ENOSYS)
    p.label("deny")
    p.op(_BPF_RET_K, code_action)
    return p.assemble()


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


def forbid_new_tasks(reporter: ctypes.CDLL | None = None) -> str:
    """Install the filter on the calling process (inherited by every thread it already has), after making the
    process non-dumpable (``/proc/self/mem`` and the like become root's, which the runner's uid cannot open).

    Starts torch's thread pool first if torch is imported. ``reporter``: the op watch library, whose trap handler
    names a refused call before the process dies (default: the one the op guard loaded, if any). Returns how a
    refused call ends the process (``"trap"`` or ``"kill"``). Raises ``SeccompUnavailable`` if the filter cannot
    be installed on every thread; never installs a partial filter.
    """
    arch = _arch()
    start_thread_pools()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    action, how = SECCOMP_RET_KILL_PROCESS, "kill"
    if _install_reporter(arch, reporter):
        action, how = SECCOMP_RET_TRAP, "trap"
    code = b"".join(filter_program(arch, action))
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompUnavailable(f"forbid_new_tasks: prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(err)}")
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
    return how


_REFUSED_TEXT = ("once your module is loaded, the process running it may not install signal handlers, start timers, "
                 "make descriptors deliver signals, or write or map new executable code; the run ended here")


def _install_reporter(arch: _Arch, reporter: ctypes.CDLL | None) -> bool:
    """The op watch library's SIGSYS handler, told the name of every call the rules judge."""
    if reporter is None:
        from kevin_exp.bench.runtime_guard import loaded_op_watch

        reporter = loaded_op_watch()
    install = getattr(reporter, "kx_sigsys_report", None) if reporter is not None else None
    if install is None:
        return False
    table = "".join(f"{nr} {name} ({R.why(name)})\n" for nr, name in R.names_by_number(arch.machine).items())
    install.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    install.restype = ctypes.c_int
    return install(table.encode(), _REFUSED_TEXT.encode()) == 0


def close_exchange_descriptor(region: Any, size: int) -> None:
    """Map the shared exchange at this run's size, then close the runner's descriptor of it, before candidate code
    loads. The exchange is a memfd: a file the runner can write that lives on no ``noexec`` mount, so through its
    descriptor (or ``/proc/self/fd``, which stays open to the process itself) code written into it could be mapped
    executable. The mapping stays; the run never needs more than ``size`` bytes."""
    if region.fd < 0:
        return
    region.mapped(size)
    # Python's mmap keeps a duplicate of the descriptor: every descriptor of the same file goes (the mappings stay;
    # the region is never resized or closed again, and the runner leaves with os._exit)
    exchange = os.fstat(region.fd)
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (exchange.st_dev, exchange.st_ino):
            os.close(fd)
    region.fd = -1


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
