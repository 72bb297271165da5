"""Running untrusted compiles: own process group, a deadline, an address-space limit, no stdin, low priority.

Compilers stay in the caller's session (``process_group=0``, not ``start_new_session``). With the kernel's
autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by default on desktop and many cloud
kernels) every session is a scheduling group of its own and niceness only ranks tasks inside one group: 16
compilers in 16 new sessions would each get as much CPU as the run worker timing a kernel, whatever their
niceness. Kept in one session, they share one group and their niceness ranks them below the evaluator.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence


@dataclass
class ProcResult:
    argv: list[str]
    returncode: int
    output: str
    seconds: float
    timed_out: bool = False
    # seconds of each tool when this result stands for several (nvcc's steps run by nvcc_pipe)
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\n{self.output}"


_PRLIMIT = shutil.which("prlimit")
_NICE = shutil.which("nice")

COMPILE_NICENESS = 10
"""Compilers run below normal CPU priority: builds are many and throughput-bound, while the one run stage
per GPU is serial (it bounds the evaluator's throughput) and times kernels (CPU contention skews launches)."""


def _limited(argv: list[str], memory_limit_gb: float):
    """(argv, preexec_fn) applying RLIMIT_AS, no core dumps and a lower CPU priority to the compiler and
    its children.

    util-linux's prlimit and coreutils' nice are preferred: a preexec_fn is not safe when the caller runs
    builds from several threads (the evaluator does)."""
    limit = int(memory_limit_gb * (1 << 30)) if memory_limit_gb > 0 else resource.RLIM_INFINITY
    if _PRLIMIT and _NICE:
        as_arg = str(limit) if memory_limit_gb > 0 else "unlimited"
        return [_NICE, "-n", str(COMPILE_NICENESS), _PRLIMIT, f"--as={as_arg}", "--core=0", "--", *argv], None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.nice(COMPILE_NICENESS)

    return argv, apply


class Group:
    """Jobs of one build, so that a failure on one side can stop the other side at once."""

    def __init__(self) -> None:
        self.cancelled = False
        self._jobs: list[Job] = []
        self._lock = threading.Lock()

    def add(self, job: Job) -> bool:
        with self._lock:
            self._jobs.append(job)
            return not self.cancelled

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            jobs = list(self._jobs)
        for job in jobs:
            job.kill()


class Job:
    """One started compiler process; `wait` enforces the shared deadline."""

    def __init__(self, argv: Sequence[str], cwd: Path, deadline: float, memory_limit_gb: float,
                 env: dict[str, str] | None = None, group: Group | None = None) -> None:
        self.argv = [str(a) for a in argv]
        self.deadline = deadline
        self.start = time.monotonic()
        self.log_path = cwd / f".log-{os.getpid()}-{id(self)}"
        self._log = open(self.log_path, "w+b")
        argv, preexec = _limited(self.argv, memory_limit_gb)
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                process_group=0, preexec_fn=preexec, env=env,
            )
        except OSError as exc:
            self._log.close()
            self.log_path.unlink(missing_ok=True)
            self.proc = None
            self.spawn_error = f"cannot run {self.argv[0]}: {exc}"
        if group is not None and not group.add(self):
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def wait(self) -> ProcResult:
        if self.proc is None:
            return ProcResult(self.argv, 127, self.spawn_error, 0.0)
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        # kill the whole group: nvcc and g++ leave cc1plus / cicc children behind otherwise
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._log.seek(0)
        output = self._log.read().decode("utf-8", errors="replace")
        self._log.close()
        self.log_path.unlink(missing_ok=True)
        return ProcResult(self.argv, self.proc.returncode, output, time.monotonic() - self.start, timed_out)


def run(argv: Sequence[str], cwd: Path, deadline: float, memory_limit_gb: float,
        env: dict[str, str] | None = None, group: Group | None = None) -> ProcResult:
    return Job(argv, cwd, deadline, memory_limit_gb, env, group).wait()
