"""Processes as the parent sees them: started ahead, talked to in JSON lines (requests on the child's stdin,
replies on a dedicated pipe), watched from outside (wall clock, memory, output) and ended with everything
they started.

``ChildProcess`` is the plumbing; ``WorkerProcess`` is the candidate's sandboxed runner. The trusted
reference process (``reference_process.ReferenceProcess``) uses the same plumbing without the sandbox.
A reply is parsed as JSON and nothing else: whatever the child writes is data to check, never code. A runner's
lines are read under ``replies``' limits and message declarations; a line that breaks them ends the runner.
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kevin_exp.bench.cpu_split import pin_process_tree
from kevin_exp.bench.fork_client import ForkedRunner, ForkServer
from kevin_exp.bench.replies import MAX_LINE_BYTES, ReplyError, parse_line, read_runner_line
from kevin_exp.bench.sandbox import SandboxPolicy, namespace_cmd, python_env
from kevin_exp.bench.uid_lease import UidLease
from kevin_exp.bench.worker.sandbox_setup import ROOT_ENV

MAX_REPLY_BYTES = MAX_LINE_BYTES


@dataclass
class Ended:
    """Why a child gave no reply: 'exited', 'timeout', 'memory' or 'garbage' (a line that is not a message it may
    send: ``detail`` says what is wrong with it)."""

    how: str
    detail: str = ""


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


class _ReplyPipe:
    """The reply pipe, read by the thread that waits for a reply: no reader thread in between, whose hand-over of
    each line (one more thread to wake, on a busy machine one more wait for a core) every message of a run would
    pay. Each line carries the monotonic time its last bytes were read (the parent's outside clock stops there);
    a line over ``MAX_REPLY_BYTES`` or an unterminated tail is garbage."""

    EMPTY = (b"", 0.0)

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.lines: deque[tuple[bytes, float] | None] = deque()
        self.lock = threading.Lock()
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def get(self, timeout_s: float) -> tuple[bytes, float] | None:
        """The next line, ``EMPTY`` when none came within ``timeout_s``, None once the child closed the pipe."""
        with self.lock:
            if not self.lines and self.fd >= 0 and self.poller.poll(max(0, math.ceil(timeout_s * 1e3))):
                self._read()
            if self.lines:
                return self.lines.popleft()
            return None if self.fd < 0 else self.EMPTY

    def _read(self) -> None:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except OSError:
            chunk = b""
        now = time.monotonic()
        if not chunk:
            if self.buf:
                self.lines.append((bytes(self.buf[:MAX_REPLY_BYTES]) + b"\x00", now))  # unterminated: never valid JSON
            self.lines.append(None)
            self._close()
            return
        self.buf += chunk
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                break
            self.lines.append((bytes(self.buf[:nl]), now))
            del self.buf[: nl + 1]
        if len(self.buf) > MAX_REPLY_BYTES:
            self.lines.append((b"\x00", now))
            self.buf.clear()

    def _close(self) -> None:
        if self.fd >= 0:
            self.poller.unregister(self.fd)
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        with self.lock:
            self._close()


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


class ChildProcess:
    """A child in its own session, with a request pipe (its stdin) and a reply pipe (``--reply-fd``)."""

    strict = False  # whether its every line must be a declared message (``replies``), empty lines included

    def pin(self, cpus: frozenset[int]) -> None:
        """Every thread of the child (and of its children) onto ``cpus`` (``cpu_split``; empty: left as is)."""
        pin_process_tree(self.proc.pid, cpus)

    def __init__(self, cmd: list[str], env: dict[str, str], reply_write_fd: int, reply_read_fd: int,
                 pass_fds: tuple[int, ...], memory_limit_bytes: int, max_output_bytes: int, cwd: Path | None = None,
                 started: ForkedRunner | None = None) -> None:
        """``started``: the child, already forked by the fork server (``cmd`` is then unused)."""
        self.memory_limit_bytes, self.max_output_bytes = memory_limit_bytes, max_output_bytes
        self.proc: subprocess.Popen | ForkedRunner = started or subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(reply_write_fd, *pass_fds), env=env, start_new_session=True, cwd=cwd)
        os.close(reply_write_fd)
        self._output = _BoundedReader(self.proc.stdout, max_output_bytes)
        self._output.start()
        self._replies = _ReplyPipe(reply_read_fd)
        self._eof = False
        self.started_at = time.monotonic()
        self.reply_at = 0.0  # when the last reply ``recv`` returned arrived (monotonic)

    def send(self, message: dict[str, Any]) -> bool:
        """Write one request; False when the child no longer reads."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def recv(self, deadline: float) -> dict[str, Any] | Ended:
        """The next reply, or why none came before ``deadline`` (the child is then killed, with its group)."""
        next_rss_check = time.monotonic() + 0.2
        while True:
            if not self._eof:
                item = self._replies.get(0.02)
                line = None if item is None else item[0]
                if line is None:
                    self._eof = True
                elif item is not _ReplyPipe.EMPTY and (line or self.strict):
                    try:
                        if line.endswith(b"\x00"):  # what ``_ReplyPipe`` makes of an over-long line or a cut-off tail
                            raise ReplyError(f"a line over {MAX_REPLY_BYTES} bytes" if line == b"\x00"
                                             else "a line cut off by the end of the pipe")
                        message = self._read_line(line)
                    except ReplyError as exc:
                        return self._end(Ended("garbage", f"{exc}: {line[:80].decode('utf-8', 'replace')!r}"))
                    self.reply_at = item[1]
                    return message
            else:
                time.sleep(0.02)
            if self._exited():
                return self._end(Ended("exited"))
            now = time.monotonic()
            if now > deadline:
                return self._end(Ended("timeout"))
            if now >= next_rss_check:
                next_rss_check = now + 0.2
                if _session_rss_bytes(self.proc.pid) > self.memory_limit_bytes:
                    return self._end(Ended("memory"))

    def _read_line(self, line: bytes) -> dict[str, Any]:
        """One line as a message (``ReplyError`` otherwise): a trusted child's, as JSON (NaN allowed)."""
        return parse_line(line, strict=False)

    def _end(self, ended: Ended) -> Ended:
        self._kill_group()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._output.join(timeout=5)
        return ended

    def output_tail(self) -> str:
        return bytes(self._output.tail[-self.max_output_bytes:]).decode("utf-8", "replace")

    @property
    def output_bytes(self) -> int:
        return self._output.total

    def alive(self) -> bool:
        return not self._exited()

    def signal_name(self) -> str | None:
        rc = self.proc.returncode
        if rc is None:
            return None
        if rc == 1 and "unshare: sigprocmask unblock failed" in self.output_tail():
            return "SIGKILL"  # util-linux unshare cannot re-raise SIGKILL on itself and exits 1 instead
        sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)  # unshare reports a killed child as 128 + signal
        if sig <= 0:
            return None
        try:
            return signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"

    def _exited(self) -> bool:
        """Whether the child has exited, without reaping it: until it is reaped its pid (= its process group's
        id) cannot be reused, so killing the group afterwards can only reach what the child left behind."""
        if self.proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except (AttributeError, OSError):
            return self.proc.poll() is not None

    def _kill_group(self) -> None:
        if self.proc.returncode is not None:
            return  # reaped already, after its group was killed: the id may belong to someone else now
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._replies.close()
        self._cleanup()

    def _cleanup(self) -> None:
        pass

    def close(self, wait: bool = True) -> threading.Thread | None:
        """End the child and everything it started, then reap it (on a returned thread with ``wait=False``:
        a GPU process's exit tears its CUDA context down, which is nobody's critical path)."""
        self._kill_group()
        if wait:
            self._reap()
            return None
        reaper = threading.Thread(target=self._reap, daemon=True, name="kx-reap")
        reaper.start()
        return reaper


class WorkerProcess(ChildProcess):
    """The candidate's runner: a sandboxed process, warm (torch imported, CUDA up) before its one candidate."""

    strict = True

    def __init__(self, policy: SandboxPolicy, backend: str, slot: int, root_dir: Path, exchange_fd: int,
                 cuda_device: str | None = None, cache_dir: Path | None = None, memory_limit_gb: float = 8.0,
                 threads: int = 0, max_output_bytes: int = 1 << 20, forbid_new_tasks: bool = True,
                 device_gate_fd: int = -1, fork_server: ForkServer | None = None) -> None:
        """``exchange_fd``: the runner's own shared region (``exchange.new_exchange_fd``); this object owns it and
        closes it when the runner is reaped."""
        self.policy, self.backend, self.slot = policy, backend, slot
        self.exchange_fd = exchange_fd
        self.workdir = root_dir / f"slot{slot}-{uuid.uuid4().hex[:12]}"
        self._lease = UidLease() if policy.mode == "namespace" and policy.drop_uid else None
        env = python_env()
        if cuda_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_device
        env["PYTHONUNBUFFERED"] = "1"
        read_fd, write_fd = os.pipe()
        args = ["--reply-fd", str(write_fd), "--exchange-fd", str(exchange_fd), "--backend", backend, "--workdir"]
        if policy.mode == "namespace":
            # private tmpfs covers /tmp, so the work dir lives inside it
            args += [f"/tmp/work-{slot}", "--private-tmp"]
            if cache_dir is not None:
                args += ["--cache-dir", str(cache_dir)]
            if self._lease is not None:
                args += ["--uid", str(self._lease.uid), "--nproc", "512"]
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
            args += [str(self.workdir)]
            if os.geteuid() != 0:
                args += ["--nproc", str(_user_tasks() + 512)]
        if backend == "cpu":
            # CUDA reserves huge virtual ranges, so the address-space limit only applies on cpu.
            args += ["--address-space-gb", str(memory_limit_gb)]
        if threads:
            args += ["--threads", str(threads)]
        if forbid_new_tasks:
            args += ["--forbid-new-tasks"]
        passed: tuple[int, ...] = (exchange_fd,)
        # cuda: the run's device region arrives on this socket (``device_exchange``), before any candidate code
        self.fd_socket: socket.socket | None = None
        theirs = None
        if backend == "cuda":
            self.fd_socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            args += ["--fd-socket", str(theirs.fileno())]
            passed += (theirs.fileno(),)
        if device_gate_fd >= 0:
            args += ["--device-gate-fd", str(device_gate_fd)]
            passed += (device_gate_fd,)
        namespaces = policy.mode == "namespace"
        started = None
        if fork_server is not None:
            fork_env = {**env, ROOT_ENV: "host"} if namespaces and policy.root == "host" else env
            started = fork_server.spawn(args, fork_env, {fd: fd for fd in (write_fd, *passed)}, namespaces)
        self.forked = started is not None
        python = [sys.executable, "-m", "kevin_exp.bench.worker", *args]
        cmd = namespace_cmd(policy) + python if namespaces else python
        try:
            super().__init__(cmd, env, write_fd, read_fd, passed, int(memory_limit_gb * (1 << 30)), max_output_bytes,
                             started=started)
        except BaseException:
            os.close(exchange_fd)
            if self.fd_socket is not None:
                self.fd_socket.close()
            raise
        finally:
            if device_gate_fd >= 0:
                os.close(device_gate_fd)  # the runner's own description of the gate: only the runner holds it
            if theirs is not None:
                theirs.close()
        self._ready: dict[str, Any] | Ended | None = None

    def _read_line(self, line: bytes) -> dict[str, Any]:
        return read_runner_line(line)

    def wait_ready(self, timeout_s: float) -> dict[str, Any] | Ended:
        """Wait for the runner's warm-up to finish (before a candidate is sent, and before the reference is timed on
        cpu, where a starting runner would take its cores); its first message, or why none came."""
        if self._ready is None:
            self._ready = self.recv(time.monotonic() + timeout_s)
        return self._ready

    def send_fd(self, fd: int) -> bool:
        """Hand the runner a descriptor on its socket (the device region's, before its candidate loads)."""
        if self.fd_socket is None:
            return False
        try:
            socket.send_fds(self.fd_socket, [b"d"], [fd])
        except OSError:
            return False
        return True

    def _cleanup(self) -> None:
        import shutil

        if self.fd_socket is not None:
            self.fd_socket.close()
            self.fd_socket = None
        if self.exchange_fd >= 0:
            os.close(self.exchange_fd)
            self.exchange_fd = -1
        if self._lease is not None:
            self._lease.release()
        if self.policy.mode != "namespace":
            shutil.rmtree(self.workdir, ignore_errors=True)


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
