"""Running untrusted compiles: own process group, a deadline, an address-space limit, no stdin, low priority,
and (Linux, root) a sandbox: new namespaces, a minimal read-only root that shows only the toolchain, the CUDA
toolkit, the Python installation (torch's and Python's headers), the lean headers, the build caches
(read-only) and the job's own folder (writable), an unprivileged leased uid and the allow-listed environment
(``jail.py`` is the launcher). A candidate's ``#include "/etc/passwd"`` finds nothing.

Compilers stay in the caller's session (``process_group=0``, not ``start_new_session``). With the kernel's
autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by default on desktop and many cloud
kernels) every session is a scheduling group of its own and niceness only ranks tasks inside one group: 16
compilers in 16 new sessions would each get as much CPU as the run worker timing a kernel, whatever their
niceness. Kept in one session, they share one group and their niceness ranks them below the evaluator.
"""
from __future__ import annotations

import importlib.util
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kevin_exp.bench import jail
from kevin_exp.bench.uid_lease import UidLease

from .flags import LEAN_HEADERS_DIR, cuda_home


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
        return f"$ {shlex.join(self.argv)}\n{self.output}"


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


_readable: set[Path] = set()
_owners: dict[Path, list] = {}  # a job folder -> [jobs in it, its mode before]
_owners_lock = threading.Lock()
_jail_state: dict[str, object] = {}
_jail_lock = threading.Lock()
LAUNCHER = Path(jail.__file__)


CACHE_PARTS_COMPILES_READ = ("lean", "pch", "reg")
"""What of a build cache a sandboxed compile sees (read-only): generated lean headers, PCHs, binding objects;
never ``ext`` (other candidates' sources and logs) beyond its own build folder."""


def allow_reading(cache_root: Path) -> None:
    """Show ``cache_root``'s shared parts read-only to every sandboxed compile of this process."""
    root = Path(cache_root).resolve()
    for part in CACHE_PARTS_COMPILES_READ:
        (root / part).mkdir(parents=True, exist_ok=True)
    _readable.add(root)


def readable_roots() -> list[Path]:
    return sorted(_readable)


def _torch_roots() -> list[str]:
    """torch's own folder, wherever it was imported from: a PYTHONPATH folder is not among the Python roots."""
    spec = importlib.util.find_spec("torch")
    return list(spec.submodule_search_locations or []) if spec is not None else []


def _toolkit_roots() -> list[str]:
    roots = [*jail.python_roots(), *_torch_roots(), str(LEAN_HEADERS_DIR)]
    home = cuda_home()
    if home and os.path.isdir(home):
        roots.append(home)
    return roots + jail.library_path_roots()


def toolkit_roots() -> list[str]:
    """The toolchain, CUDA toolkit and Python folders a sandboxed compile sees (read-only)."""
    return _toolkit_roots()


def jail_spec(cwd: Path, uid: int | None, memory_limit_gb: float) -> dict:
    shared = [str(root / part) for root in sorted(_readable) for part in CACHE_PARTS_COMPILES_READ]
    return {"readonly": [*_toolkit_roots(), *shared], "writable": [str(cwd)], "cwd": str(cwd),
            "uid": uid, "nproc": 1024, "address_space_gb": memory_limit_gb, "nice": COMPILE_NICENESS,
            "tmp_size": "4g", "shm_size": "64m"}


def sandboxed() -> bool:
    """Whether compiles run in the sandbox here (Linux, root, and a test compile in it works); probed once."""
    with _jail_lock:
        if "on" not in _jail_state:
            on, note = False, "compiles are not sandboxed: it needs Linux and root"
            if sys.platform.startswith("linux") and os.geteuid() == 0:
                on, note = _probe_jail()
            _jail_state.update(on=on, note=note)
        return bool(_jail_state["on"])


def sandbox_note() -> str:
    sandboxed()
    return str(_jail_state["note"])


def _probe_jail() -> tuple[bool, str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kx-jail-probe-") as tmp:
        lease = UidLease()
        try:
            spec = {"readonly": [], "writable": [tmp], "cwd": tmp, "uid": lease.uid}
            cmd = [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec), "--", "true"]
            os.chmod(tmp, 0o777)
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=jail.allowed_env())
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"compiles are not sandboxed: the sandbox does not start here ({exc})"
        finally:
            lease.release()
    if res.returncode != 0:
        return False, f"compiles are not sandboxed: the sandbox does not start here ({res.stderr.strip()[-300:]})"
    return True, "compiles sandboxed (namespaces, minimal read-only root, leased uid)"


def compile_env(env: dict[str, str] | None) -> dict[str, str]:
    """The allow-listed environment, plus what the caller set itself (values not taken from ours)."""
    if env is None:
        return jail.allowed_env()
    keep = jail.allowed_env(env)
    keep.update({k: v for k, v in env.items() if os.environ.get(k) != v})
    return keep


def _lend_folder(cwd: Path, uid: int) -> None:
    with _owners_lock:
        entry = _owners.setdefault(cwd, [0, None])
        if entry[0] == 0:
            entry[1] = stat_mode = os.stat(cwd).st_mode & 0o7777
            os.chmod(cwd, stat_mode | 0o777)
        entry[0] += 1


def _take_back_folder(cwd: Path, uid: int) -> None:
    """What the compile wrote under its uid goes back to us; the folder's mode is restored after the last job."""
    me_uid, me_gid = os.getuid(), os.getgid()
    for dirpath, dirnames, filenames in os.walk(cwd):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            try:
                if os.lstat(path).st_uid == uid:
                    os.lchown(path, me_uid, me_gid)
            except OSError:
                continue
    with _owners_lock:
        entry = _owners.get(cwd)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            os.chmod(cwd, entry[1])
            del _owners[cwd]


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
        self.cwd = Path(cwd).resolve()
        self._lease: UidLease | None = None
        if sandboxed():
            self._lease = UidLease()
            _lend_folder(self.cwd, self._lease.uid)
            spec = jail_spec(self.cwd, self._lease.uid, memory_limit_gb)
            argv, preexec = [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec), "--", *self.argv], None
        else:
            argv, preexec = _limited(self.argv, memory_limit_gb)
        try:
            if _stopped:
                raise OSError("the run is stopping (Ctrl-C)")
            self.proc = subprocess.Popen(
                argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                process_group=0, preexec_fn=preexec, env=compile_env(env),
            )
        except OSError as exc:
            self._give_back()
            self._log.close()
            self.log_path.unlink(missing_ok=True)
            self.proc = None
            self.spawn_error = f"cannot run {self.argv[0]}: {exc}"
        else:
            _running[id(self)] = self
            if _stopped:  # stop_compiles ran while it started
                self.kill_group()
        if group is not None and not group.add(self):
            self.kill()

    def kill_group(self) -> None:
        """SIGKILL to the compiler's process group, waiting for nothing."""
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        _running.pop(id(self), None)

    def _give_back(self) -> None:
        if self._lease is not None:
            self._lease.release()
            _take_back_folder(self.cwd, self._lease.uid)
            self._lease = None

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
        _running.pop(id(self), None)
        self._give_back()
        self._log.seek(0)
        output = self._log.read().decode("utf-8", errors="replace")
        self._log.close()
        self.log_path.unlink(missing_ok=True)
        return ProcResult(self.argv, self.proc.returncode, output, time.monotonic() - self.start, timed_out)


# the compilers running now (by id of their Job), and whether a Ctrl-C stopped compiling in this process
_running: dict[int, Job] = {}
_stopped = False


def stop_compiles() -> None:
    """A Ctrl-C (``run/signals.py``): every compiler this process runs is killed, its whole process group (compilers
    lead groups of their own, so a terminal's Ctrl-C never reaches them), and none starts after it: a build then
    fails as the machine's (never remembered as the candidate's). No lock, no wait: it runs in the signal handler."""
    global _stopped
    _stopped = True
    for job in list(_running.values()):
        job.kill_group()


def wait_for_compiles(timeout_s: float) -> None:
    """Until every compiler killed by ``stop_compiles`` has been reaped by its build (at most ``timeout_s``)."""
    end = time.monotonic() + timeout_s
    while _running and time.monotonic() < end:
        time.sleep(0.05)


def run(argv: Sequence[str], cwd: Path, deadline: float, memory_limit_gb: float,
        env: dict[str, str] | None = None, group: Group | None = None) -> ProcResult:
    return Job(argv, cwd, deadline, memory_limit_gb, env, group).wait()
