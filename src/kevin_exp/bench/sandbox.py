"""Sandboxed worker processes: namespaces, an unprivileged uid, resource limits, a wall clock and a
memory watchdog. Nothing a candidate does inside can take the caller down.

Isolation levels (``BenchConfig.sandbox``):
- ``namespace`` (Linux, root): ``unshare`` gives the worker its own PID, mount and network namespaces;
  a private tmpfs is mounted on /tmp and /dev/shm; the worker then drops to an unprivileged uid
  leased for its lifetime (no two live workers on the machine share one, across evaluators and
  processes) that owns nothing outside its own directory, so RLIMIT_NPROC stops fork bombs and the
  file system outside is read-only to it. Killing the namespace's first process, then everything
  left under the uid, kills every process the candidate started.
- ``process`` (anywhere else): a new session with resource limits (address space on the cpu backend,
  file size, no core dumps, process count for non-root users); the whole process group is killed.
``auto`` picks ``namespace`` when a probe shows it works, else ``process``.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kevin_exp.bench.result_channel import RESULT_KEY_BYTES, read_signed_result

SANDBOX_UID_BASE = 61000
SANDBOX_UID_POOL = 4096
UID_LOCK_DIR = Path("/run/kevin_exp-uids") if Path("/run").is_dir() else Path("/tmp/kevin_exp-uids")
_probe_cache: dict[str, "SandboxPolicy"] = {}


class UidLease:
    """An exclusive claim on one sandbox uid, held through an flock for as long as a worker lives.

    A uid is shared state: killing "everything under uid N" after a worker ends must never hit another
    live worker (a warm standby, another evaluator in the same or another process).
    """

    def __init__(self) -> None:
        UID_LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        start = (os.getpid() * 7919 + time.monotonic_ns()) % SANDBOX_UID_POOL
        for i in range(SANDBOX_UID_POOL):
            uid = SANDBOX_UID_BASE + (start + i) % SANDBOX_UID_POOL
            fd = os.open(UID_LOCK_DIR / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            _kill_uid(uid)  # whatever a crashed earlier owner left behind
            return
        raise RuntimeError(f"all {SANDBOX_UID_POOL} sandbox uids from {SANDBOX_UID_BASE} are in use")

    def release(self) -> None:
        if self._fd >= 0:
            _kill_uid(self.uid)
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class SandboxPolicy:
    mode: str  # "namespace" | "process"
    drop_uid: bool
    note: str = ""

    def describe(self) -> str:
        if self.mode == "namespace":
            who = "leased unprivileged uid" if self.drop_uid else "root (interpreter not readable by an unprivileged uid)"
            return f"namespace(pid,mount,net; private /tmp; {who})"
        return "process(new session, rlimits)"


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTHONSTARTUP", None)
    return env


def _namespace_cmd() -> list[str]:
    # A fresh /proc: with the host's, /proc/self names the wrong process in the new PID namespace and
    # CUDA initialisation fails (error 304); it also hides the host's processes from the candidate.
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--net", "--"]


def probe_policy(requested: str = "auto", backend: str = "cpu") -> SandboxPolicy:
    """Find the strongest isolation this machine allows for ``backend`` (cached per process).

    The probe starts a real worker (on cuda: with CUDA initialised), so a machine whose driver refuses
    namespaces falls back to a weaker level instead of failing every candidate.
    """
    key = f"{requested}/{backend}"
    if key in _probe_cache:
        return _probe_cache[key]
    policy = SandboxPolicy("process", False, "namespaces not requested")
    if requested in ("auto", "namespace") and sys.platform.startswith("linux") and os.geteuid() == 0:
        lease = UidLease()
        try:
            uid_works = _probe_worker(backend, private_tmp=True, uid=lease.uid)
        finally:
            lease.release()
        if uid_works:
            policy = SandboxPolicy("namespace", True)
        elif _probe_worker(backend, private_tmp=True, uid=None):
            policy = SandboxPolicy("namespace", False, "an unprivileged uid cannot run the Python environment")
        else:
            policy = SandboxPolicy("process", False, "unshare or mount refused")
    elif requested in ("auto", "namespace"):
        policy = SandboxPolicy("process", False, "namespaces need Linux and root")
    if requested == "namespace" and policy.mode != "namespace":
        raise RuntimeError(f"sandbox=namespace is not available here ({policy.note}); use sandbox=auto or process")
    _probe_cache[key] = policy
    return policy


def _probe_worker(backend: str, private_tmp: bool, uid: int | None) -> bool:
    read_fd, write_fd = os.pipe()
    cmd = _namespace_cmd() + [sys.executable, "-m", "kevin_exp.bench.worker", "--probe", "--backend", backend,
                              "--result-fd", str(write_fd), "--workdir", "/tmp/probe"]
    if private_tmp:
        cmd.append("--private-tmp")
    if uid is not None:
        cmd += ["--uid", str(uid)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                pass_fds=(write_fd,), env=_python_env(), start_new_session=True)
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return False
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        out = pipe.read()
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return False
    return rc == 0 and b'"probe": "ok"' in out


@dataclass
class WorkerOutcome:
    result: dict[str, Any] | None
    returncode: int | None
    timed_out: bool
    memory_exceeded: bool
    output_tail: str
    output_bytes: int
    seconds: float
    forged: bool = False  # something other than the worker wrote to its result pipe

    def signal_name(self) -> str | None:
        rc = self.returncode
        if rc is None:
            return None
        if rc == 1 and "unshare: sigprocmask unblock failed" in self.output_tail:
            return "SIGKILL"  # util-linux unshare cannot re-raise SIGKILL on itself and exits 1 instead
        # unshare reports a killed child as 128 + signal
        sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
        if sig <= 0:
            return None
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"


class _BoundedReader(threading.Thread):
    """Drains a pipe, keeping the last ``keep`` bytes; 100 MB of output costs nothing but reading."""

    def __init__(self, stream: Any, keep: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.keep = stream, keep
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        while True:
            chunk = self.stream.read1(1 << 16) if hasattr(self.stream, "read1") else self.stream.read(1 << 16)
            if not chunk:
                return
            self.total += len(chunk)
            self.tail += chunk
            if len(self.tail) > 2 * self.keep:
                del self.tail[: len(self.tail) - self.keep]


def _session_rss_bytes(sid: int) -> int:
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != sid:  # field 6 (session) counted after the ")" that ends comm
                continue
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


class WorkerProcess:
    """One warm worker process waiting for its single job."""

    def __init__(
        self,
        policy: SandboxPolicy,
        backend: str,
        slot: int,
        root_dir: Path,
        cuda_device: str | None = None,
        cache_dir: Path | None = None,
        memory_limit_gb: float = 8.0,
        threads: int = 0,
        max_output_bytes: int = 1 << 20,
    ) -> None:
        self.policy, self.backend, self.slot = policy, backend, slot
        self.memory_limit_bytes = int(memory_limit_gb * (1 << 30))
        self.max_output_bytes = max_output_bytes
        self.workdir = root_dir / f"slot{slot}-{uuid.uuid4().hex[:12]}"
        self._lease = UidLease() if policy.mode == "namespace" and policy.drop_uid else None
        env = _python_env()
        if cuda_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_device
        env["PYTHONUNBUFFERED"] = "1"
        read_fd, write_fd = os.pipe()
        args = [sys.executable, "-m", "kevin_exp.bench.worker", "--result-fd", str(write_fd), "--backend", backend, "--workdir"]
        if policy.mode == "namespace":
            # private tmpfs covers /tmp, so the work dir lives inside it
            args += [f"/tmp/work-{slot}", "--private-tmp"]
            if cache_dir is not None:
                args += ["--cache-dir", str(cache_dir)]
            if self._lease is not None:
                args += ["--uid", str(self._lease.uid), "--nproc", "512"]
            cmd = _namespace_cmd() + args
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
            args += [str(self.workdir)]
            if os.geteuid() != 0:
                args += ["--nproc", str(_user_tasks() + 512)]
            cmd = args
        if backend == "cpu":
            # CUDA reserves huge virtual ranges, so the address-space limit only applies on cpu.
            cmd += ["--address-space-gb", str(memory_limit_gb)]
        if threads:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(write_fd,),
            env=env,
            start_new_session=True,
        )
        os.close(write_fd)
        self._result_pipe = os.fdopen(read_fd, "rb")
        self._output = _BoundedReader(self.proc.stdout, max_output_bytes)
        self._output.start()
        self._result_bytes = bytearray()
        self._result_closed = threading.Event()
        self._result_reader = threading.Thread(target=self._read_result, daemon=True)
        self._result_reader.start()
        self.started_at = time.monotonic()

    def _read_result(self) -> None:
        while True:
            chunk = self._result_pipe.read(1 << 16)
            if not chunk:
                self._result_closed.set()
                return
            if len(self._result_bytes) < 64 << 20:
                self._result_bytes += chunk

    def alive(self) -> bool:
        return not self._exited()

    def run(self, job: dict[str, Any], timeout_s: float) -> WorkerOutcome:
        """Send the job, then wait until the worker has reported a correctly signed result (the worker's
        exit, which on a GPU includes tearing its CUDA context down, is not waited for: ``close`` reaps it),
        until it exits without one, or until the deadline or the memory limit ends it."""
        t0 = time.monotonic()
        key = secrets.token_bytes(RESULT_KEY_BYTES)
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(key + json.dumps(job).encode())
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the worker died while waiting; its exit status says how
        ended = self._wait(key, t0 + timeout_s)
        if ended != "reported":
            # whatever is left (a timed-out worker, children holding the result pipe) goes with the group
            self._kill_group()
            self._wait_exit()
            self._result_reader.join(timeout=5)
            self._output.join(timeout=5)
        result, forged = read_signed_result(key, bytes(self._result_bytes))
        tail = bytes(self._output.tail[-self.max_output_bytes :]).decode("utf-8", "replace")
        return WorkerOutcome(
            result=result,
            returncode=self.proc.returncode,
            timed_out=ended == "timeout",
            memory_exceeded=ended == "memory",
            output_tail=tail,
            output_bytes=self._output.total,
            seconds=time.monotonic() - t0,
            forged=forged,
        )

    def _wait(self, key: bytes, deadline: float) -> str:
        """'reported', 'exited', 'timeout' or 'memory'."""
        result_checked = False
        next_rss_check = time.monotonic() + 0.2
        while True:
            if not result_checked and self._result_closed.wait(timeout=0.02):
                result_checked = True
                result, forged = read_signed_result(key, bytes(self._result_bytes))
                if result is not None and not forged and "worker_error" not in result:
                    return "reported"
            elif result_checked:
                # the pipe closed without a valid result: the process decides (it may still crash or hang)
                time.sleep(0.05)
            if self._exited():
                return "exited"
            now = time.monotonic()
            if now > deadline:
                return "timeout"
            if now >= next_rss_check:
                next_rss_check = now + 0.2
                if _session_rss_bytes(self.proc.pid) > self.memory_limit_bytes:
                    return "memory"

    def _exited(self) -> bool:
        """Whether the worker has exited, without reaping it: until it is reaped its pid (= its process group's
        id) cannot be reused, so killing the group afterwards can only reach what the worker left behind."""
        if self.proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except (AttributeError, OSError):  # no waitid on this platform, or the child is gone already
            return self.proc.poll() is not None

    def _kill_group(self) -> None:
        if self.proc.returncode is not None:
            return  # reaped already, after its group was killed: the id may belong to someone else now
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _wait_exit(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _reap(self) -> None:
        self._wait_exit()
        self._cleanup()

    def _cleanup(self) -> None:
        import shutil

        if self._lease is not None:
            self._lease.release()
        if self.policy.mode != "namespace":
            shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self, wait: bool = True) -> threading.Thread | None:
        """End the worker and everything it started (its process group; in a namespace sandbox, its PID
        namespace and anything left under its uid), then release its uid. With ``wait=False`` the reaping
        runs on a thread, returned for joining: a GPU worker's exit tears its CUDA context down, which is
        nobody's critical path."""
        self._kill_group()
        if wait:
            self._reap()
            return None
        reaper = threading.Thread(target=self._reap, daemon=True, name="kx-reap")
        reaper.start()
        return reaper


def _user_tasks() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def _kill_uid(uid: int) -> None:
    """Leftovers of a sandbox uid (processes that escaped the session) are killed too."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue
