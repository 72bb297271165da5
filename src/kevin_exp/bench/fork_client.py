"""The evaluator's side of the fork server (``kevin_exp.bench.worker.fork_server``): one per evaluator, started
when the evaluator is, and asked for each new candidate runner. A runner it forks is handed back as a
``ForkedRunner``, the part of ``subprocess.Popen`` that ``worker_process.ChildProcess`` uses, so the runner is
watched, killed and read exactly as an exec'd one is.

Where the server cannot start or cannot fork (more than one thread after its imports, namespaces refused), the
caller starts the runner the exec way instead; ``describe()`` says which way runners start and why.
"""
from __future__ import annotations

import itertools
import json
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from kevin_exp.bench.cpu_split import pin_process_tree
from kevin_exp.bench.replies import ReplyError, parse_line
from kevin_exp.bench.sandbox import python_env

START_TIMEOUT_S = 180.0
REPLY_TIMEOUT_S = 60.0
UNKNOWN_STATUS = 1  # a runner that ended after the server died: its status went with the server
STOPPED_WAIT_S = 3.0  # how long a stopped server is given to kill its runners and exit before it is killed


class ForkedRunner:
    """A runner forked by the server, seen like a ``subprocess.Popen``: ``pid`` (its process group and session),
    ``stdin``/``stdout`` pipes, ``poll``/``wait``. ``poll`` never reaps: until ``wait`` has asked the server to
    reap it, its pid cannot be reused, so killing its process group is always safe."""

    def __init__(self, server: "ForkServer", pid: int, stdin: Any, stdout: Any) -> None:
        self.server, self.pid, self.stdin, self.stdout = server, pid, stdin, stdout
        self.returncode: int | None = None
        self._status: int | None = None
        self._ended = threading.Event()
        try:
            self.pidfd: int | None = os.pidfd_open(pid)  # watched only if the server dies before the runner
        except OSError:
            self.pidfd = None

    def ended(self, status: int) -> None:
        self._status = status
        self._ended.set()

    def poll(self) -> int | None:
        return self._status if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"runner {self.pid}", timeout or 0)
        self.server.reap(self.pid)
        assert self._status is not None
        self.returncode = self._status
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        return self.returncode


class ForkServer:
    def __init__(self, backend: str, log_dir: Path, cpus: frozenset[int] = frozenset()) -> None:
        """``cpus``: where the server, and so every runner it forks, runs until a run slot takes the runner (the
        compile cores, ``cpu_split``; empty: anywhere)."""
        self.backend, self.cpus = backend, cpus
        self.log_path = log_dir / "fork-server.log"
        self.unusable = ""  # why runners start the exec way, once the server cannot serve
        self._lock = threading.Lock()  # one request on the socket at a time
        self._ids = itertools.count()
        self._replies: dict[int, dict] = {}
        self._replied = threading.Condition()
        self._runners: dict[int, ForkedRunner] = {}
        self._early_exits: dict[int, int] = {}  # runners that ended before their spawn call registered them
        self._restarts = 0
        self._ready: dict | None = None
        self._dead = False
        self._stopped = False  # a Ctrl-C: no runner is forked and the server is not restarted (stop)
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = python_env()
        env["PYTHONUNBUFFERED"] = "1"
        # numpy's OpenBLAS starts a thread pool at import; the server must stay single-threaded to fork
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kevin_exp.bench.worker.fork_server", "--control-fd", str(theirs.fileno()),
                 "--backend", self.backend],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),), env=env,
                start_new_session=True)
        pin_process_tree(self._proc.pid, self.cpus)
        theirs.close()
        self._sock, self._dead, self._ready = ours, False, None
        threading.Thread(target=self._read, args=(ours,), daemon=True, name="kx-fork-server").start()

    # -- the reader thread ---------------------------------------------------------------------------
    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self._server_died()
                return
            try:  # the server never runs candidate code; a message it should not send means it is broken
                message = parse_line(data, strict=False)
                self._take(message)
            except (ReplyError, KeyError, TypeError, ValueError):
                self._server_died()
                return

    def _take(self, message: dict) -> None:
        op = message.get("op")
        with self._replied:
            if op == "exited":
                runner = self._runners.pop(int(message["pid"]), None)
                if runner is not None:
                    runner.ended(int(message["status"]))
                else:
                    self._early_exits[int(message["pid"])] = int(message["status"])
            elif op == "ready":
                self._ready = message
            else:
                self._replies[int(message["id"])] = message
            self._replied.notify_all()

    def _server_died(self) -> None:
        with self._replied:
            self._dead = True
            self._replied.notify_all()
            orphans = list(self._runners.values())
            self._runners.clear()
        if orphans:
            threading.Thread(target=_watch_orphans, args=(orphans,), daemon=True, name="kx-fork-orphans").start()

    def _wait_for(self, key: int | None, timeout_s: float) -> dict | None:
        with self._replied:
            ok = self._replied.wait_for(
                lambda: self._dead or (self._ready is not None if key is None else key in self._replies), timeout_s)
            if key is None:
                return self._ready
            return self._replies.pop(key, None) if ok else None

    # -- requests ----------------------------------------------------------------------------------------
    def ready(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """Whether the server is warm and able to fork (waits for its imports the first time)."""
        if self.unusable or self._stopped:
            return False
        if self._dead:
            if self._restarts:
                self.unusable = "the fork server died twice"
                return False
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._restarts += 1
            self._start()
        ready = self._wait_for(None, timeout_s)
        if ready is None:
            self.unusable = "the fork server did not start: " + self._log_tail()
        elif ready.get("error"):
            self.unusable = f"the fork server cannot serve: {ready['error']}"
        elif ready.get("threads") != 1:
            self.unusable = (f"the fork server has {ready.get('threads')} threads after its imports "
                             f"({', '.join(ready.get('thread_names') or [])}; the first after importing "
                             f"{ready.get('threaded_by')}); a fork copies only one")
        return not self.unusable

    def spawn(self, argv: list[str], env: dict[str, str], fds: dict[int, int], namespaces: bool) -> ForkedRunner | None:
        """A runner running ``kevin_exp.bench.worker`` with ``argv``, its descriptors ``fds`` (number in the runner
        -> ours) plus stdin and stdout/stderr pipes; None when the server cannot (the caller execs instead)."""
        if not self.ready():
            return None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        targets = [0, 1, 2, *fds]
        sources = [in_r, out_w, out_w, *fds.values()]
        key = next(self._ids)
        request = {"op": "spawn", "id": key, "argv": argv, "env": env, "targets": targets, "namespaces": namespaces}
        try:
            with self._lock:
                assert self._sock is not None
                socket.send_fds(self._sock, [json.dumps(request).encode()], sources)
                reply = self._wait_for(key, REPLY_TIMEOUT_S)
                if reply is not None and "pid" in reply:
                    runner = ForkedRunner(self, int(reply["pid"]), os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"))
                    in_w = out_r = -1
                    with self._replied:
                        if runner.pid in self._early_exits:
                            runner.ended(self._early_exits.pop(runner.pid))
                        elif self._dead:
                            threading.Thread(target=_watch_orphans, args=([runner],), daemon=True).start()
                        else:
                            self._runners[runner.pid] = runner
                    return runner
        except OSError as exc:
            reply = {"error": str(exc)}
        finally:
            for fd in (in_r, out_w, in_w, out_r):
                if fd >= 0:
                    os.close(fd)
        if reply is not None and reply.get("error"):
            self.unusable = f"the fork server could not fork a runner: {reply['error']}"
        return None

    def reap(self, pid: int) -> None:
        if self._dead or self._sock is None:
            return
        try:
            with self._lock:
                self._sock.send(json.dumps({"op": "reap", "pid": pid}).encode())
        except OSError:
            pass

    def cpu_seconds(self) -> float:
        """CPU seconds of the server and of the runners it has reaped (a benchmark's measure of runner starts)."""
        key = next(self._ids)
        with self._lock:
            assert self._sock is not None
            self._sock.send(json.dumps({"op": "stats", "id": key}).encode())
            reply = self._wait_for(key, REPLY_TIMEOUT_S)
        if reply is None:
            raise RuntimeError("the fork server gave no stats")
        return float(reply["cpu_s"]) + float(reply["children_cpu_s"])

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The server's exit status once closed: 0 when it ended on its own (its runners killed and reaped)."""
        return self._proc.returncode if self._proc is not None else None

    def describe(self) -> str:
        return f"exec ({self.unusable})" if self.unusable else "fork (from a warm fork server)"

    def stop(self) -> None:
        """A Ctrl-C (``Evaluator.stop``): no runner is forked from now on, and whoever waits for the server (its start
        takes its imports) stops waiting (our end shut: the reader sees the server gone). The server then kills what
        it runs and exits; ``close`` waits a moment for that. No lock, no wait: it runs in the signal handler."""
        self._stopped = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Closing our end makes the server kill what it still runs and exit."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # a close alone leaves the reader's recv holding it open
            except OSError:
                pass
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            wait_s = 30.0
            if self._stopped:  # a server still importing (never ready) has no runner: it is not waited for
                wait_s = STOPPED_WAIT_S if self._ready is not None else 0.0
            try:
                self._proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"


def _watch_orphans(runners: list[ForkedRunner]) -> None:
    """After the server died: a runner's end is seen on its pidfd (its status went with the server)."""
    pending = {r.pidfd: r for r in runners if r.pidfd is not None}
    for r in runners:
        if r.pidfd is None:
            r.ended(UNKNOWN_STATUS)
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLIN)
    while pending:
        for fd, _ in poller.poll():
            poller.unregister(fd)
            pending.pop(fd).ended(UNKNOWN_STATUS)
