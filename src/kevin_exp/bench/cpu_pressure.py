"""How contended the machine's CPUs were over a stretch of a run, from the kernel's pressure stall information
(``/proc/pressure/cpu``: the microseconds during which some runnable task waited for a CPU). The hidden-time
check compares the path cost of the candidate's calls with that of the calibration calls made earlier; when the
CPUs were contended during the calls and not during the calibration, every copy and wake-up on the path
stretched, and the difference is the load's, no proof of a runner hiding time (``verdict.contention_rose``).
The share saturates (some task always waits on an oversubscribed machine), so it says whether the load rose,
not by how much the path stretched."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

PRESSURE_FILE = Path("/proc/pressure/cpu")


def stall_us(path: Path = PRESSURE_FILE) -> int | None:
    """The machine's cumulative CPU stall time ("some" line) in microseconds; None where the kernel has no PSI."""
    try:
        with open(path) as f:
            return int(f.readline().split("total=")[1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Window:
    """A stretch of time opened by ``Window()``; ``share()`` is the part of it during which some task waited."""

    path: Path = PRESSURE_FILE
    stall_at_start: int | None = field(init=False)
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.stall_at_start = stall_us(self.path)
        self.started = time.monotonic()

    def share(self) -> float | None:
        stall, elapsed = stall_us(self.path), time.monotonic() - self.started
        if stall is None or self.stall_at_start is None or elapsed <= 0:
            return None
        return round(min(1.0, max(0.0, (stall - self.stall_at_start) / 1e6 / elapsed)), 4)
