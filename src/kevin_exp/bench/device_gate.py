"""Keeping a GPU quiet while a candidate is timed on it.

Each CUDA run slot times one candidate at a time, but its standby runners keep starting beside it, and a
starting runner creates a CUDA context and runs warm-up kernels: on the same GPU, at the same moment, that
work time-slices with the timed calls and inflates them. The gate is a lock file: the slot holds it
exclusively (``flock``) from its calibration calls to its last call; each standby runner is handed its own
open description of the file and holds it shared for its CUDA start-up only, then closes it before any
candidate code exists (so no candidate can hold it). A runner's start waits while a candidate is timed; a
timed run waits, up to ``wait_s``, for start-ups already under way.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterator

POLL_S = 0.005


class DeviceGate:
    def __init__(self, path: Path, wait_s: float = 5.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        self.path, self.wait_s = path, wait_s
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def runner_fd(self) -> int:
        """A new open description of the lock file, inheritable, for one runner (its lock is its own)."""
        fd = os.open(self.path, os.O_RDONLY)
        os.set_inheritable(fd, True)
        return fd

    @contextlib.contextmanager
    def quiet(self) -> Iterator[float]:
        """Held exclusively for a run's calls; yields the seconds spent waiting for runners' CUDA start-ups
        (after ``wait_s`` it goes on without the lock rather than stall the run)."""
        t0 = time.monotonic()
        held = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() - t0 > self.wait_s:
                    break
                time.sleep(POLL_S)
        try:
            yield time.monotonic() - t0
        finally:
            if held:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@contextlib.contextmanager
def starting_on_the_device(fd: int) -> Iterator[None]:
    """In a starting runner: hold the gate shared while CUDA starts, then close it for good."""
    if fd < 0:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        # unlocked explicitly: closing alone would keep the lock while any other process holds a copy of this
        # description (the sandbox launcher that forked the runner does, for the runner's whole life)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
