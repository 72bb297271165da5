"""The sandbox's isolation level: which one this machine allows (probed once per process) and the command
and environment a worker is started with. The worker process itself is ``worker_process.WorkerProcess``;
what it sets up inside is ``worker.sandbox_setup``. Nothing a candidate does inside can take the caller down.

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

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kevin_exp.bench.uid_lease import UidLease

_probe_cache: dict[str, "SandboxPolicy"] = {}


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


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTHONSTARTUP", None)
    return env


def namespace_cmd() -> list[str]:
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
    cmd = namespace_cmd() + [sys.executable, "-m", "kevin_exp.bench.worker", "--probe", "--backend", backend,
                             "--result-fd", str(write_fd), "--workdir", "/tmp/probe"]
    if private_tmp:
        cmd.append("--private-tmp")
    if uid is not None:
        cmd += ["--uid", str(uid)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                pass_fds=(write_fd,), env=python_env(), start_new_session=True)
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

