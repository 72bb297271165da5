"""The static checks' hard deadline (``CheckRules.static_check_deadline_s``).

A regular expression or a Python loop cannot be interrupted from another thread, so the checks run in a
small checker process (``checker_process``) that the caller kills when it runs over: a runaway check costs
at most the deadline, then a fresh process. Idle checkers are kept and reused (one per concurrent caller),
so a check costs a round trip through a pipe, not a process start; the deadline clock starts once the
checker is ready, so a slow start on a loaded machine is not charged to the candidate.

``run_checked(kind, check, args, rules)`` returns what ``check(*args)`` returns (in the checker process:
``checker_process.KINDS[kind]``, the same function), re-raises the exceptions the checks raise on purpose
(``SyntaxError`` and friends), and turns a check that overran or whose process died into a ``check_deadline``
violation. The caller hands the check in, so this module does not import the checks that call it.
"""
from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from kevin_exp.bench.checks.rules import Violation
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import CandidateSource

CHECK_DEADLINE = "check_deadline"
_HEADER = struct.Struct("<Q")
_START_TIMEOUT_S = 120.0  # a checker's start (imports), not charged to the candidate
_MAX_IDLE = 8


class CheckerDied(RuntimeError):
    pass


class _Checker:
    """One checker process and its pipes."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        # a process group of its own, as the compilers: a terminal's Ctrl-C reaches the run alone, which stops
        # cleanly (run/signals.py), and the checker ends with it (its stdin closes) instead of dying with a traceback
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kevin_exp.bench.checks.checker_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True, process_group=0)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout.fileno()
        if self._read(1, time.monotonic() + _START_TIMEOUT_S) != b"R":
            self.kill()
            raise CheckerDied(f"the static checker process did not start (exit code {self.proc.poll()})")

    def call(self, payload: bytes, deadline_s: float) -> bytes | None:
        """The reply, or None when it did not come within ``deadline_s`` (the process is then killed)."""
        end = time.monotonic() + deadline_s
        try:
            self.stdin.write(_HEADER.pack(len(payload)) + payload)
            self.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        header = self._read(_HEADER.size, end)
        if header is None:
            return None
        return self._read(_HEADER.unpack(header)[0], end)

    def _read(self, n: int, end: float) -> bytes | None:
        chunks: list[bytes] = []
        while n:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.stdout, min(n, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.stdin.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def alive(self) -> bool:
        return self.proc.poll() is None


_idle: list[_Checker] = []
_lock = threading.Lock()


@atexit.register
def _close_idle() -> None:
    """Idle checkers end on their own when their stdin closes; this reaps them."""
    with _lock:
        checkers, _idle[:] = list(_idle), []
    for checker in checkers:
        checker.kill()


def _take() -> _Checker:
    with _lock:
        while _idle:
            checker = _idle.pop()
            if checker.alive():
                return checker
    return _Checker()


def _give_back(checker: _Checker) -> None:
    with _lock:
        if len(_idle) < _MAX_IDLE:
            _idle.append(checker)
            return
    checker.kill()


def run_checked(kind: str, check: Callable[..., Any], args: tuple[Any, ...], rules: CheckRules) -> Any:
    """Run ``check(*args)`` (``checker_process.KINDS[kind]``) under ``rules.static_check_deadline_s`` (0: in
    this process, without a deadline)."""
    deadline_s = rules.static_check_deadline_s
    if deadline_s <= 0:
        return check(*args)
    payload = pickle.dumps((kind, args), protocol=pickle.HIGHEST_PROTOCOL)
    checker = _take()
    try:
        reply = checker.call(payload, deadline_s)
    except BaseException:
        checker.kill()
        raise
    if reply is None:
        died = not checker.alive()
        code = checker.proc.poll()
        checker.kill()
        if died:
            text = f"the static checks ended abnormally (checker exit code {code}) on this program; write a simpler one"
        else:
            text = (f"the static checks did not finish within {deadline_s:g} s (static_check_deadline_s); write a "
                    "smaller or simpler program")
        return _overran(kind, Violation(CHECK_DEADLINE, text))
    _give_back(checker)
    status, value = pickle.loads(reply)
    if status == "raise":
        raise value
    return value


def _overran(kind: str, violation: Violation) -> Any:
    if kind == "candidate":
        return CandidateSource(), [violation]
    return [violation]
