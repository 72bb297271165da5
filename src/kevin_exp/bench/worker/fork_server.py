"""The fork server: a process that has imported what a candidate's runner needs (torch, its extension
machinery, the runner's own modules) and forks each new runner from that state instead of starting a fresh
interpreter, so a runner's start costs a fork and its own set-up (sandbox, thread pools, CUDA), not an
interpreter start and torch's import (most of a runner's start-up CPU on a GPU box).

It is started by ``kevin_exp.bench.fork_client.ForkServer`` with the sandbox's allow-listed environment, never
loads candidate code, never initialises CUDA, and holds nothing of the evaluator's (no seed, no reference). It
forks only while it has one thread (a fork copies the calling thread alone). Messages are JSON objects on a
``SOCK_SEQPACKET`` socket, the runner's file descriptors attached to its spawn request:

- ``{"op": "spawn", "id", "argv", "env", "targets", "namespaces"}`` + fds: fork a runner whose descriptors
  ``targets[i]`` are the attached fds, environment ``env``, running ``kevin_exp.bench.worker`` with ``argv``;
  with ``namespaces``, in fresh PID, mount, network, IPC and UTS namespaces (as ``unshare --pid --fork --mount
  --mount-proc --net --ipc --uts`` gives the exec'd runner). Reply ``{"op": "spawned", "id", "pid"}`` (or
  ``"error"``); the runner leads its own session, so ``pid`` is its process group and session id.
- ``{"op": "reap", "pid"}``: reap an exited runner. Until then its pid stays taken, so the evaluator may kill
  the runner's process group without reaching a process that reused the number.
- ``{"op": "stats", "id"}``: the server's CPU seconds and those of its reaped runners.
Unasked: ``{"op": "ready", "threads", "pid"}`` once warm; ``{"op": "exited", "pid", "status"}`` when a runner
ends (``status``: exit code, or minus the signal). When the evaluator's end closes, every runner still alive is
killed with its process group and the server exits.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Iterator

MAX_MESSAGE = 1 << 16
MAX_FDS = 16
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)
_libc = ctypes.CDLL(None, use_errno=True)


WARM_IMPORTS = ("torch", "torch.utils.cpp_extension", "kevin_exp.bench.runtime_guard", "kevin_exp.bench.seccomp",
                "kevin_exp.bench.worker.entry", "kevin_exp.bench.worker.runner", "kevin_exp.bench.worker.timing")
# the module only: CUDA itself starts in each runner
CUDA_IMPORTS = ("torch.cuda", "kevin_exp.bench.device_gate")


def warm_imports(backend: str) -> str | None:
    """What every runner imports before its candidate arrives (``worker.entry``), without running anything.
    Returns the first module after whose import the process had more than one thread (None: none had)."""
    first_threaded = None
    for name in WARM_IMPORTS + (CUDA_IMPORTS if backend == "cuda" else ()):
        with _no_driver_probe(name):
            importlib.import_module(name)
        if first_threaded is None and thread_count() > 1:
            first_threaded = name
    return first_threaded


@contextlib.contextmanager
def _no_driver_probe(module: str) -> Iterator[None]:
    """On a CUDA build, ``torch.utils.cpp_extension`` asks ``torch.cuda.is_available()`` when it loads, only to warn
    when a toolkit has no runtime; asking starts the CUDA driver (``cuInit``) and its threads, after which no fork
    can use CUDA (seen on the H100 machines, with ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` too). While that module loads
    the question is answered without the driver; each runner starts CUDA itself."""
    torch = sys.modules.get("torch")
    if module != "torch.utils.cpp_extension" or torch is None or module in sys.modules:
        yield
        return
    asked = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_available = asked


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_names() -> list[str]:
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:
            pass
    return names


def settle_threads(limit_s: float) -> int:
    """Wait up to ``limit_s`` for threads that imports started and that end on their own (seen on a GPU machine
    right after ``import torch``); returns how many threads remain."""
    deadline = time.monotonic() + limit_s
    while thread_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread_count()


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def _place_fds(fds: list[int], targets: list[int]) -> None:
    """Make ``targets[i]`` refer to ``fds[i]`` and close every other descriptor."""
    import fcntl

    low = max([*targets, *fds, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low) for fd in fds]  # out of every target's way
    for target, fd in zip(targets, moved):
        os.dup2(fd, target, inheritable=True)
    keep = set(targets)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _unshare(flags: int) -> None:
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _mount_private_proc() -> None:
    """What ``unshare --mount-proc`` does in the new namespaces: mounts private, a /proc of the new PID namespace."""
    from kevin_exp.bench import jail

    jail.mount(None, "/", None, jail.MS_REC | jail.MS_PRIVATE)
    jail.mount("proc", "/proc", "proc", jail.MS_NOSUID | jail.MS_NODEV | jail.MS_NOEXEC)


def _run_runner(request: dict, fds: list[int]) -> None:
    """In the runner (never returns): descriptors, session, environment, then the runner's own main."""
    code = 1
    try:
        _place_fds(fds, list(request["targets"]))
        os.environ.clear()
        os.environ.update(request["env"])
        from kevin_exp.bench.worker.entry import main

        main(list(request["argv"]))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the runner's output is what the evaluator reads
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _child(request: dict, fds: list[int], report_fd: int) -> None:
    """The forked process (never returns). The runner leads its own session before its pid is reported, so the
    evaluator's first kill of its group reaches it. With namespaces this process enters them, forks the runner
    (PID 1 of the new PID namespace), reports it and exits, so the runner is re-parented to the server (a child
    subreaper) as a direct child it can wait for."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    try:
        if request.get("namespaces"):
            _unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID)
            sync_r, sync_w = os.pipe()
            pid = os.fork()
            if pid:
                os.close(sync_w)
                if os.read(sync_r, 1) != b"k":
                    os.waitpid(pid, 0)
                    raise OSError("the runner could not mount its /proc (see the fork server's log)")
                os.write(report_fd, str(pid).encode())
                os._exit(0)
            os.close(sync_r)
            os.close(report_fd)
            os.setsid()
            try:
                _mount_private_proc()
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os.write(sync_w, b"k")
            os.close(sync_w)
        else:
            os.setsid()
            os.write(report_fd, str(os.getpid()).encode())
            os.close(report_fd)
    except BaseException as exc:  # noqa: BLE001 - reported to the server, which replies with it
        try:
            os.write(report_fd, f"error: {exc}".encode())
        finally:
            os._exit(1)
    _run_runner(request, fds)


class Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pidfds: dict[int, int] = {}  # runner pid -> pidfd, until it has exited
        self.exited: set[int] = set()  # exited, not yet reaped

    def serve(self) -> None:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == self.sock.fileno():
                    if not self._handle(poller):
                        self._shutdown()
                        return
                else:
                    self._runner_ended(fd, poller)

    def _handle(self, poller: select.poll) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except OSError:
            return False
        if not data:
            return False
        request = json.loads(data)
        op = request.get("op")
        if op == "spawn":
            try:
                reply = self._spawn(request, fds, poller)
            except OSError as exc:  # the evaluator then starts this runner the exec way
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            _send(self.sock, {"op": "spawned", "id": request["id"], **reply})
        elif op == "reap":
            pid = int(request["pid"])
            if pid in self.exited:
                self.exited.discard(pid)
                os.waitpid(pid, 0)
        elif op == "stats":
            own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            _send(self.sock, {"op": "stats", "id": request.get("id"), "threads": thread_count(),
                              "cpu_s": own.ru_utime + own.ru_stime,
                              "children_cpu_s": children.ru_utime + children.ru_stime})
        return True

    def _spawn(self, request: dict, fds: list[int], poller: select.poll) -> dict:
        try:
            if settle_threads(2.0) != 1:
                return {"error": f"the fork server has {thread_count()} threads ({', '.join(thread_names())}); a fork "
                                 "would copy only one"}
            sys.stdout.flush()
            sys.stderr.flush()
            read_fd, write_fd = os.pipe()
            first = os.fork()
            if first == 0:
                os.close(read_fd)
                self.sock.close()
                _child(request, fds, write_fd)
            os.close(write_fd)
            report = b""
            while chunk := os.read(read_fd, 4096):
                report += chunk
            os.close(read_fd)
            if request.get("namespaces"):
                os.waitpid(first, 0)  # it exits once it has reported; the runner is now the server's child
            if not report.isdigit():
                if not request.get("namespaces"):
                    os.waitpid(first, 0)
                return {"error": report.decode(errors="replace") or "the forked process ended without a word"}
            pid = int(report)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            os.killpg(pid, signal.SIGKILL)  # it leads its session and is not reaped: the group is still its own
            os.waitpid(pid, 0)
            raise
        self.pidfds[pid] = pidfd
        poller.register(pidfd, select.POLLIN)
        return {"pid": pid}

    def _runner_ended(self, pidfd: int, poller: select.poll) -> None:
        pid = next(p for p, fd in self.pidfds.items() if fd == pidfd)
        poller.unregister(pidfd)
        del self.pidfds[pid]
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT)
        os.close(pidfd)
        status = -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
        self.exited.add(pid)
        _send(self.sock, {"op": "exited", "pid": pid, "status": status})

    def _shutdown(self) -> None:
        for pid in list(self.pidfds) + list(self.exited):
            try:
                os.killpg(pid, signal.SIGKILL)  # unreaped: the group id is still this runner's
            except OSError:
                pass
        for pid in list(self.pidfds) + list(self.exited):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kevin_exp.bench.worker.fork_server")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.control_fd)
    if _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _send(sock, {"op": "ready", "error": "prctl(PR_SET_CHILD_SUBREAPER) failed"})
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threaded_by = warm_imports(args.backend)
    threads = settle_threads(10.0)
    _send(sock, {"op": "ready", "threads": threads, "thread_names": thread_names(), "threaded_by": threaded_by,
                 "pid": os.getpid()})
    Server(sock).serve()


if __name__ == "__main__":
    main()
