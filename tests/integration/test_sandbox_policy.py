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
    assert "leased unprivileged uid" in policy.describe()


def test_explicit_process_level_is_honoured():
    policy = probe_policy("process", "cpu")
    assert policy.mode == "process" and not policy.drop_uid
