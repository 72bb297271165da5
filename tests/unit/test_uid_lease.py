"""Sandbox uid leases: exclusive across processes, and releasing one kills what was left under it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kevin_exp.bench.uid_lease import UidLease

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="uid leases are only used by root namespace sandboxes")


def test_live_leases_never_share_a_uid():
    leases = [UidLease() for _ in range(8)]
    try:
        assert len({lease.uid for lease in leases}) == 8
    finally:
        for lease in leases:
            lease.release()


def test_a_lease_held_by_another_process_is_skipped():
    code = "from kevin_exp.bench.uid_lease import UidLease; l = UidLease(); print(l.uid, flush=True); import time; time.sleep(30)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        mine = [UidLease() for _ in range(64)]
        try:
            assert held not in {lease.uid for lease in mine}
        finally:
            for lease in mine:
                lease.release()
    finally:
        holder.kill()
        holder.wait()


def test_release_kills_processes_left_under_the_uid():
    lease = UidLease()
    uid = lease.uid
    straggler = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
    time.sleep(0.2)
    lease.release()
    assert straggler.wait(timeout=10) == -9
