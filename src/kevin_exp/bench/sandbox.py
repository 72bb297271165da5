"""The sandbox's isolation level: which one this machine allows (probed once per process) and the command
and environment a worker is started with. The worker process itself is ``worker_process.WorkerProcess``;
what it sets up inside is ``worker.sandbox_setup``. Nothing a candidate does inside can take the caller down.

Isolation levels (``BenchConfig.sandbox``):
- ``namespace`` (Linux, root): ``unshare`` gives the worker its own PID, mount, network, IPC and UTS
  namespaces; the worker pivots into a minimal read-only root (``jail``, ``worker.sandbox_setup``: the
  Python installation, the package, the build cache, system libraries, a minimal /dev, a fresh /proc,
  private tmpfs /tmp and /dev/shm, nothing else of the host); the worker then drops to an unprivileged uid
  leased for its lifetime (no two live workers on the machine share one, across evaluators and
  processes) that owns nothing outside its own directory, so RLIMIT_NPROC stops fork bombs and the
  file system outside is read-only to it. Killing the namespace's first process, then everything
  left under the uid, kills every process the candidate started.
- ``process`` (anywhere else): a new session with resource limits (address space on the cpu backend,
  file size, no core dumps, process count for non-root users); the whole process group is killed.
``auto`` picks ``namespace`` when a probe shows it works, else ``process``. The probe tries the strongest
form first and falls back one step at a time (minimal root with a leased uid; the host's file system with
a leased uid; as root; no namespaces); ``SandboxPolicy.describe()`` says which one a run got and why.

Every sandboxed process (worker, compiler) gets the allow-listed environment (``python_env``), never a
copy of the evaluator's.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kevin_exp.bench import jail
from kevin_exp.bench.uid_lease import UidLease
from kevin_exp.bench.worker.sandbox_setup import ROOT_ENV

_probe_cache: dict[str, "SandboxPolicy"] = {}


@dataclass(frozen=True)
class SandboxPolicy:
    mode: str  # "namespace" | "process"
    drop_uid: bool
    note: str = ""
    root: str = "minimal"  # namespace mode: "minimal" (own read-only root) | "host" (host's file system, private /tmp)

    def describe(self) -> str:
        if self.mode == "namespace":
            who = "leased unprivileged uid" if self.drop_uid else "root (interpreter not readable by an unprivileged uid)"
            files = "minimal read-only root" if self.root == "minimal" else "host file system, private /tmp"
            text = f"namespace(pid,mount,net,ipc; {files}; {who})"
            return f"{text} [fallback: {self.note}]" if self.note else text
        return f"process(new session, rlimits) [{self.note}]" if self.note else "process(new session, rlimits)"


def python_env() -> dict[str, str]:
    """The environment a sandboxed Python process starts with: the allow-list (``jail.ENV_NAMES`` and
    ``jail.ENV_PREFIXES``: PATH, locale, CUDA_/NVIDIA_, thread settings, TORCH_ ...) and PYTHONPATH naming
    the package's source folder; never a copy of the caller's environment."""
    env = jail.allowed_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


def namespace_cmd(policy: SandboxPolicy | None = None) -> list[str]:
    """The prefix that starts a worker in fresh namespaces (its sandbox is then set up from inside)."""
    # A fresh /proc: with the host's, /proc/self names the wrong process in the new PID namespace and
    # CUDA initialisation fails (error 304); it also hides the host's processes from the candidate.
    cmd = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--net", "--ipc", "--uts", "--"]
    if policy is not None and policy.root == "host":
        cmd += ["env", f"{ROOT_ENV}=host"]
    return cmd


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
        failures: list[str] = []
        steps = [("minimal", True, "minimal root, leased uid"), ("host", True, "host file system, leased uid"),
                 ("host", False, "host file system, root")]
        policy = SandboxPolicy("process", False, "unshare or mount refused")
        for root, with_uid, why in steps:
            lease = UidLease() if with_uid else None
            try:
                error = _probe_worker(backend, private_tmp=True, uid=lease.uid if lease else None, root=root)
            finally:
                if lease is not None:
                    lease.release()
            if error is None:
                note = "; ".join(failures) if failures else ""
                policy = SandboxPolicy("namespace", with_uid, note, root)
                break
            failures.append(f"{why} failed: {error}")
        else:
            policy = SandboxPolicy("process", False, "unshare or mount refused: " + "; ".join(failures))
    elif requested in ("auto", "namespace"):
        policy = SandboxPolicy("process", False, "namespaces need Linux and root")
    if requested == "namespace" and policy.mode != "namespace":
        raise RuntimeError(f"sandbox=namespace is not available here ({policy.note}); use sandbox=auto or process")
    _probe_cache[key] = policy
    return policy


def _probe_worker(backend: str, private_tmp: bool, uid: int | None, root: str = "minimal") -> str | None:
    """None if a worker starts (and on cuda, initialises CUDA) in this sandbox, else what went wrong."""
    read_fd, write_fd = os.pipe()
    policy = SandboxPolicy("namespace", uid is not None, root=root)
    cmd = namespace_cmd(policy) + [sys.executable, "-m", "kevin_exp.bench.worker", "--probe", "--backend", backend,
                                   "--result-fd", str(write_fd), "--workdir", "/tmp/probe"]
    if private_tmp:
        cmd.append("--private-tmp")
    if uid is not None:
        cmd += ["--uid", str(uid)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=(write_fd,), env=python_env(), start_new_session=True)
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        return str(exc)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        out = pipe.read()
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "the probe worker timed out"
    if proc.returncode == 0 and b'"probe": "ok"' in out:
        return None
    detail = (out.decode(errors="replace") + " " + output.decode(errors="replace")).strip()
    return f"exit {proc.returncode}: {detail[-300:]}"
