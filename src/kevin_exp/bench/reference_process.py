"""The trusted reference process as the parent sees it (its inside is ``reference_server``), and the on-disk
cache of reference timings. Started with ``sandbox.python_env()`` (not in the candidate's sandbox: it only
ever runs reference programs), in a private working directory, warm for the life of its run slot."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from kevin_exp.bench.sandbox import python_env
from kevin_exp.bench.worker_process import ChildProcess, Ended

START_TIMEOUT_S = 300.0


class ReferenceFailed(Exception):
    """The reference process failed a request: the reference program raised, or the process died or hung."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class ReferenceProcess(ChildProcess):
    def __init__(self, backend: str, cuda_device: str | None, threads: int, max_output_bytes: int = 1 << 20) -> None:
        """The process starts with no shared region: each run attaches its runner's (``attach_exchange``)."""
        env = python_env()
        if cuda_device is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_device
        env["PYTHONUNBUFFERED"] = "1"
        self.private_dir = Path(tempfile.mkdtemp(prefix="kx-reference-"))
        read_fd, write_fd = os.pipe()
        # each run's exchange descriptor is handed over on this socket (SCM_RIGHTS)
        self._fd_socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, "-m", "kevin_exp.bench.reference_server", "--reply-fd", str(write_fd),
               "--exchange-socket", str(theirs.fileno()), "--backend", backend]
        if threads:
            cmd += ["--threads", str(threads)]
        try:
            super().__init__(cmd, env, write_fd, read_fd, (theirs.fileno(),), 1 << 50, max_output_bytes,
                             cwd=self.private_dir)
        finally:
            theirs.close()
        self._ready = False
        self.pending = 0  # requests asked and not yet answered: nonzero after a run means it is a reply behind
        self.busy_s = 0.0  # seconds the process reported working on requests (``answer``)
        self.busy_by_op: dict[str, float] = {}  # the same, by request

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.ask(request)
        return self.answer(request, timeout_s)

    def ask(self, request: dict[str, Any]) -> None:
        """Send a request without waiting for its reply (``answer`` takes it): the parent can meanwhile drive
        the runner. Every request asked is answered before the next is asked."""
        if not self._ready:
            first = self.recv(time.monotonic() + START_TIMEOUT_S)
            if isinstance(first, Ended) or first.get("op") != "ready":
                raise ReferenceFailed(f"the reference process did not start ({self._why(first)})", self.output_tail())
            self._ready = True
        if not self.send(request):
            raise ReferenceFailed("the reference process is gone", self.output_tail())
        self.pending += 1

    def answer(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        reply = self.recv(time.monotonic() + timeout_s)
        self.pending -= 1
        if isinstance(reply, Ended):
            raise ReferenceFailed(f"the reference process failed during {request.get('op')!r} ({self._why(reply)})",
                                  self.output_tail())
        if reply.get("op") == "error":
            raise ReferenceFailed(f"the reference program failed: {reply.get('reason', '')}", reply.get("detail", ""))
        busy = float(reply.get("s") or 0.0)
        self.busy_s += busy
        op = str(request.get("op"))
        self.busy_by_op[op] = self.busy_by_op.get(op, 0.0) + busy
        return reply

    def attach_exchange(self, fd: int, timeout_s: float) -> None:
        """Serve the run of the runner whose shared region is ``fd`` (the one before is let go)."""
        self.ask({"op": "exchange"})
        try:
            socket.send_fds(self._fd_socket, [b"x"], [fd])
        except OSError as exc:
            raise ReferenceFailed(f"the reference process cannot take the shared region ({exc})", self.output_tail())
        self.answer({"op": "exchange"}, timeout_s)

    def device_region(self, base: int, nbytes: int, timeout_s: float) -> tuple[int, int] | str:
        """A fresh device allocation for the run's outputs part (``device_exchange``): its descriptor (ours to
        close) and its size, or why the reference process could not make one."""
        reply = self.call({"op": "device_region", "base": base, "bytes": nbytes}, timeout_s)
        if reply.get("error"):
            return str(reply["error"])
        try:  # (sent before the reply: it is there, or it never comes)
            self._fd_socket.settimeout(5.0)
            _, fds, _, _ = socket.recv_fds(self._fd_socket, 16, 1)
        except OSError as exc:
            return f"its descriptor did not arrive ({exc})"
        finally:
            self._fd_socket.settimeout(None)
        if len(fds) != 1:
            return "its descriptor did not arrive"
        return fds[0], int(reply["bytes"])

    def _why(self, ended: Any) -> str:
        if isinstance(ended, Ended):
            return {"timeout": "no reply in time"}.get(ended.how, ended.how)
        return f"unexpected reply {str(ended)[:200]}"

    def _cleanup(self) -> None:
        self._fd_socket.close()
        shutil.rmtree(self.private_dir, ignore_errors=True)


class ReferenceTimings:
    """Reference timings on disk, one per (problem source, device name, torch version, timing settings, statistic):
    measured by the trusted process, so nothing a candidate does can slow them. Each entry is a JSON record (the
    kept block's samples ``ms``, its ``value`` under ``statistic``, its ``spread``, when and how it was measured; see
    ``reference_timing``). Jobs sharing a cache dir share the entries: a write replaces the file whole (a reader
    sees the old record or the new, never part of one), and ``measuring`` holds a lock across processes so two jobs
    do not measure at once."""

    def __init__(self, cache_dir: Path) -> None:
        self.root = Path(cache_dir) / "ref_timing"

    @staticmethod
    def key(source: str, backend: str, device: str, torch_version: str, warmup: int, trials: int,
            statistic: str = "min") -> str:
        # v2: records measured with the statistic the speedup uses and cached only when quiet (v1 kept a block's
        # samples by its median whatever the statistic, and whatever the machine was doing)
        payload = json.dumps([source, backend, device, torch_version, warmup, trials, statistic, "v2"])
        return hashlib.sha256(payload.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached record, or None when there is none or it is not a whole, consistent record."""
        try:
            record = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return None
        return record if _valid_record(record) else None

    def put(self, key: str, record: dict[str, Any]) -> None:
        if not _valid_record(record):
            raise ValueError(f"not a reference timing record: {str(record)[:200]}")
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)  # unique per writer
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def measuring(self, name: str, timeout_s: float) -> Iterator[bool]:
        """Held while a reference is measured (``name``: what may not be measured twice at once: a problem's key, or
        the whole machine's cores). Waits for a holder in any process (up to ``timeout_s``, then goes on
        without it); gives whether it got the lock."""
        self.root.mkdir(parents=True, exist_ok=True)
        # the evaluator's own uid only: a sandboxed runner sees the cache (read-only) but must not hold this lock
        fd = os.open(self.root / f".measuring-{name[:64]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # (one made before with looser bits)
        deadline = time.monotonic() + timeout_s
        held = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
            yield held
        finally:
            os.close(fd)  # (releases the lock)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _valid_record(record: Any) -> bool:
    """A whole record whose value is its samples' statistic (anything else, an older format included, is a miss)."""
    if not isinstance(record, dict):
        return False
    samples, value, spread = record.get("ms"), record.get("value"), record.get("spread")
    if not (isinstance(samples, list) and samples and all(_number(x) and x >= 0 for x in samples)):
        return False
    if not (_number(value) and _number(spread) and spread >= 0) or record.get("statistic") not in ("min", "median"):
        return False
    expected = min(samples) if record["statistic"] == "min" else statistics.median(samples)
    return math.isclose(float(value), float(expected), rel_tol=1e-9, abs_tol=1e-12)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
