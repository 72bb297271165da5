"""What the runner's seccomp filter refuses once candidate code is about to load, besides new tasks
(``seccomp.py``): every way to make code run outside the calls the harness makes, and every way to write code.

- **Code that runs later**: a signal handler (``rt_sigaction`` with a new action; a query, with no new action,
  is allowed), timers that deliver signals (``setitimer``, ``alarm``, ``timer_create``, ``timer_settime``),
  descriptors that deliver signals (``fcntl`` ``F_SETFL`` with ``O_ASYNC``, ``F_SETSIG``, ``F_SETOWN(_EX)``,
  ``F_SETLEASE``, ``F_NOTIFY``; ``ioctl`` ``FIOASYNC``, ``FIOSETOWN``, ``SIOCSPGRP``), pages filled on a fault
  by the process itself (``userfaultfd``) and kernel work that completes later (``io_uring_*``).
- **Code that is written**: ``mprotect``/``pkey_mprotect`` to an executable protection, ``mmap`` of executable
  memory that is writable or anonymous, ``mremap`` onto a chosen address, SysV shared memory attached
  executable (``shmat`` with ``SHM_EXEC``), ``personality`` changes (``READ_IMPLIES_EXEC`` makes every readable
  mapping executable), ``memfd_create`` (a writable file on an executable mount), ``ptrace``,
  ``process_vm_readv``/``process_vm_writev``, ``prctl(PR_SET_DUMPABLE)`` (the runner makes itself non-dumpable
  first, so ``/proc/self/mem`` is root's), ``unshare``/``setns`` (a user namespace would allow new mounts),
  ``perf_event_open``.

File-backed executable mappings that are not writable stay allowed: that is how ``dlopen`` loads the
candidate's extension. Every file the runner can write lies on a ``noexec`` mount (``jail.py``) or is closed
before candidate code loads (the exchange file, ``close_exchange_descriptor``).
"""
from __future__ import annotations

from dataclasses import dataclass

# asm-generic values, the same on x86_64 and aarch64
PROT_WRITE, PROT_EXEC = 0x2, 0x4
MAP_ANONYMOUS = 0x20
O_ASYNC = 0o20000
F_SETFL, F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE, F_NOTIFY = 4, 8, 10, 15, 1024, 1026
FIOASYNC, FIOSETOWN, SIOCSPGRP = 0x5452, 0x8901, 0x8902
PR_SET_DUMPABLE = 4
SHM_EXEC = 0o100000
MREMAP_FIXED, MREMAP_DONTUNMAP = 2, 4
PERSONALITY_QUERY = 0xFFFFFFFF

# name -> (x86_64 number, aarch64 number or None where the call does not exist)
NUMBERS: dict[str, tuple[int, int | None]] = {
    "rt_sigaction": (13, 134), "setitimer": (38, 103), "alarm": (37, None), "timer_create": (222, 107),
    "timer_settime": (223, 110), "fcntl": (72, 25), "ioctl": (16, 29), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "mprotect": (10, 226), "pkey_mprotect": (329, 288), "mmap": (9, 222), "mremap": (25, 216),
    "shmat": (30, 196), "personality": (135, 92), "memfd_create": (319, 279), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "prctl": (157, 167),
    "unshare": (272, 97), "setns": (308, 268), "perf_event_open": (298, 241),
}


@dataclass(frozen=True)
class Rule:
    """When a call is refused: ``always``, or by its arguments (``arg`` is the argument's index; only its low
    32 bits are read except for ``nonzero``): ``nonzero`` (a pointer given), ``bits`` (any of ``values[0]``'s bits
    set), ``one_of`` (equal to one of ``values``), ``not`` (anything but ``values[0]``)."""

    syscall: str
    kind: str = "always"
    arg: int = 0
    values: tuple[int, ...] = ()
    why: str = ""


RULES: tuple[Rule, ...] = (
    Rule("rt_sigaction", "nonzero", 1, why="installing a signal handler"),
    Rule("setitimer", why="a timer that delivers a signal"),
    Rule("alarm", why="a timer that delivers a signal"),
    Rule("timer_create", why="a timer that delivers a signal"),
    Rule("timer_settime", why="a timer that delivers a signal"),
    Rule("ioctl", "one_of", 1, (FIOASYNC, FIOSETOWN, SIOCSPGRP), why="a descriptor that delivers signals"),
    Rule("userfaultfd", why="pages filled later by the process itself"),
    Rule("io_uring_setup", why="kernel work that completes later"),
    Rule("io_uring_enter", why="kernel work that completes later"),
    Rule("io_uring_register", why="kernel work that completes later"),
    Rule("mprotect", "bits", 2, (PROT_EXEC,), why="making memory executable, to rewrite code"),
    Rule("pkey_mprotect", "bits", 2, (PROT_EXEC,), why="making memory executable, to rewrite code"),
    Rule("mremap", "bits", 3, (MREMAP_FIXED | MREMAP_DONTUNMAP,), why="moving a mapping onto a chosen address"),
    Rule("shmat", "bits", 2, (SHM_EXEC,), why="executable shared memory"),
    Rule("personality", "not", 0, (PERSONALITY_QUERY,), why="changing the personality, e.g. READ_IMPLIES_EXEC"),
    Rule("memfd_create", why="a writable file that can be mapped executable"),
    Rule("ptrace", why="writing the process's own code"),
    Rule("process_vm_readv", why="writing the process's own code"),
    Rule("process_vm_writev", why="writing the process's own code"),
    Rule("prctl", "one_of", 0, (PR_SET_DUMPABLE,), why="making /proc/self/mem writable again"),
    Rule("unshare", why="new namespaces, with mounts of their own"),
    Rule("setns", why="new namespaces, with mounts of their own"),
    Rule("perf_event_open", why="performance counters that deliver signals"),
)
# two rules that need more than one argument: written out in seccomp.filter_program
MMAP_WHY = "executable memory that is writable or anonymous, to write code"
FCNTL_WHY = "a descriptor that delivers signals: O_ASYNC, F_SETSIG, F_SETOWN, leases, F_NOTIFY"
FCNTL_SIGNAL_CMDS = (F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE, F_NOTIFY)


def number(name: str, machine: str) -> int | None:
    pair = NUMBERS[name]
    return pair[0] if machine == "x86_64" else pair[1]


def names_by_number(machine: str) -> dict[int, str]:
    """{syscall number: name} of every call these rules judge (for the trap handler's message)."""
    return {nr: name for name in NUMBERS if (nr := number(name, machine)) is not None}


def why(name: str) -> str:
    if name == "mmap":
        return MMAP_WHY
    if name == "fcntl":
        return FCNTL_WHY
    return next((r.why for r in RULES if r.syscall == name), "")
