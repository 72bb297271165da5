"""A sandboxed worker process as the parent sees it: started ahead of its job, sent one job, watched
(wall clock, memory, output), and ended with everything it started. ``WorkerOutcome`` is the run's raw result.
"""
from __future__ import annotations

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
from kevin_exp.bench.sandbox import SandboxPolicy, namespace_cmd, python_env
from kevin_exp.bench.uid_lease import UidLease


@dataclass
class WorkerOutcome:
    """What one run left behind: the worker's result (if one came), how the process ended, its output's tail."""

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
        env = python_env()
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
            cmd = namespace_cmd(policy) + args
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
