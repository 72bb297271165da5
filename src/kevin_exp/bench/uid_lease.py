"""Sandbox uids: each namespace worker runs as an unprivileged uid leased for its lifetime, so no two live
workers on the machine (across evaluators and processes) ever share one."""
from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

SANDBOX_UID_BASE = 61000
SANDBOX_UID_POOL = 4096
UID_LOCK_DIR = Path("/run/kevin_exp-uids") if Path("/run").is_dir() else Path("/tmp/kevin_exp-uids")


class UidLease:
    """An exclusive claim on one sandbox uid, held through an flock for as long as a worker lives.

    A uid is shared state: killing "everything under uid N" after a worker ends must never hit another
    live worker (a warm standby, another evaluator in the same or another process).
    """

    def __init__(self) -> None:
        UID_LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        start = (os.getpid() * 7919 + time.monotonic_ns()) % SANDBOX_UID_POOL
        for i in range(SANDBOX_UID_POOL):
            uid = SANDBOX_UID_BASE + (start + i) % SANDBOX_UID_POOL
            fd = os.open(UID_LOCK_DIR / f"{uid}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            _kill_uid(uid)  # whatever a crashed earlier owner left behind
            return
        raise RuntimeError(f"all {SANDBOX_UID_POOL} sandbox uids from {SANDBOX_UID_BASE} are in use")

    def release(self) -> None:
        if self._fd >= 0:
            _kill_uid(self.uid)
            os.close(self._fd)
            self._fd = -1


def _kill_uid(uid: int) -> None:
    """Leftovers of a sandbox uid (processes that escaped the session) are killed too."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue
