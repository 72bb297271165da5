"""The sandbox probe: on a Linux root machine with unshare (this one, CI) the strongest level is used."""
from __future__ import annotations

import os
import shutil
import sys

import pytest

from kevin_exp.bench.sandbox import probe_policy

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="namespace sandboxes need Linux, root and unshare",
)


def test_root_linux_gets_namespaces_and_an_unprivileged_uid():
    policy = probe_policy("auto", "cpu")
    assert policy.mode == "namespace" and policy.drop_uid, policy.note
    assert policy.root == "minimal" and not policy.note, policy.describe()
    assert "leased unprivileged uid" in policy.describe() and "minimal read-only root" in policy.describe()


@pytest.mark.gpu
def test_cuda_workers_initialise_cuda_inside_the_minimal_root():
    """On a GPU machine the probe starts a worker with CUDA up inside the minimal root; a fallback shows in describe()."""
    policy = probe_policy("auto", "cuda")
    assert policy.mode == "namespace" and policy.drop_uid and policy.root == "minimal", policy.describe()


def test_the_environment_is_an_allow_list(monkeypatch):
    from kevin_exp.bench.sandbox import python_env

    monkeypatch.setenv("KX_TEST_SECRET", "nope")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    env = python_env()
    assert "KX_TEST_SECRET" not in env and "HOME" not in env
    assert env["OMP_NUM_THREADS"] == "3" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["PYTHONPATH"].endswith("src") and "PATH" in env


def test_explicit_process_level_is_honoured():
    policy = probe_policy("process", "cpu")
    assert policy.mode == "process" and not policy.drop_uid


def test_a_checkout_under_tmp_stays_visible_inside_the_private_tmp(tmp_path):
    """A CI clone in /tmp: the sandbox's private /tmp must not hide the code the worker runs."""
    import subprocess
    from pathlib import Path

    import kevin_exp

    copy = Path("/tmp") / f"kx-clone-{tmp_path.name}"
    shutil.copytree(Path(kevin_exp.__file__).parent, copy / "src" / "kevin_exp")
    try:
        probe = ("import kevin_exp, sys; from kevin_exp.bench.sandbox import probe_policy; "
                 "p = probe_policy('auto', 'cpu'); print(kevin_exp.__file__); print(p.mode, p.drop_uid, p.note)")
        out = subprocess.run([sys.executable, "-c", probe], cwd=copy, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(copy / "src")})
        assert out.returncode == 0, out.stderr
        origin, verdict = out.stdout.strip().splitlines()[-2:]
        assert origin.startswith(str(copy))
        assert verdict.startswith("namespace True"), verdict
    finally:
        shutil.rmtree(copy, ignore_errors=True)


@pytest.mark.parametrize("root", ["minimal", "host"])
def test_each_fallback_level_starts_a_worker(root):
    """The weaker level the probe falls back to (host file system, private /tmp) works with a leased uid too."""
    from kevin_exp.bench.sandbox import SandboxPolicy, _probe_worker
    from kevin_exp.bench.uid_lease import UidLease

    lease = UidLease()
    try:
        assert _probe_worker("cpu", private_tmp=True, uid=lease.uid, root=root) is None
    finally:
        lease.release()
    text = SandboxPolicy("namespace", True, "minimal root, leased uid failed: exit 3", "host").describe()
    assert "host file system" in text and "fallback: minimal root" in text
