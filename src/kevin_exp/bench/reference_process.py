"""The trusted reference process as the parent sees it (its inside is ``reference_server``), and the on-disk
cache of reference timings. Started with ``sandbox.python_env()`` (not in the candidate's sandbox: it only
ever runs reference programs), in a private working directory, warm for the life of its run slot."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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

    def _why(self, ended: Any) -> str:
        if isinstance(ended, Ended):
            return {"timeout": "no reply in time"}.get(ended.how, ended.how)
        return f"unexpected reply {str(ended)[:200]}"

    def _cleanup(self) -> None:
        self._fd_socket.close()
        shutil.rmtree(self.private_dir, ignore_errors=True)


class ReferenceTimings:
    """Reference timings on disk, one per (problem source, device name, torch version, timing settings):
    measured once by the trusted process, so nothing a candidate does can slow them."""

    def __init__(self, cache_dir: Path) -> None:
        self.root = Path(cache_dir) / "ref_timing"

    @staticmethod
    def key(source: str, backend: str, device: str, torch_version: str, warmup: int, trials: int) -> str:
        payload = json.dumps([source, backend, device, torch_version, warmup, trials, "v1"])
        return hashlib.sha256(payload.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> list[float] | None:
        try:
            samples = json.loads(self._path(key).read_text())["ms"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if isinstance(samples, list) and samples and all(isinstance(x, (int, float)) and x >= 0 for x in samples):
            return [float(x) for x in samples]
        return None

    def put(self, key: str, samples: list[float]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"ms": samples}))
        os.replace(tmp, path)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
