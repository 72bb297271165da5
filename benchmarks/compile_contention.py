"""How much compiles slow down the serial run stage: a fixed CPU-bound task in a process of its own session
(as the evaluator starts its run workers) is timed idle, then while one compiler-like CPU hog per core runs
through the evaluator's compile launcher (niceness 10, the caller's session), then while the same hogs run
each in a new session (the launcher before 2026-11-24).

    python benchmarks/compile_contention.py [--hogs N] [--work N]

With the kernel's autogroup scheduling on (printed), every session is a scheduling group of its own and
niceness only ranks tasks inside one group: hogs in new sessions get as much CPU as the timed task.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from kevin_exp.bench.build import proc

HOG = [sys.executable, "-c", "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"]


def timed_task_s(work: int) -> float:
    """Seconds a worker-like process (new session, normal priority) needs for ``work`` loop iterations."""
    code = f"import time\nt = time.perf_counter()\ns = 0\nfor i in range({work}): s += i\nprint(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, start_new_session=True, check=True)
    return float(out.stdout)


def under_load(start_hog: Callable[[], Callable[[], None]], n: int, work: int) -> float:
    """The timed task while ``n`` hogs run; ``start_hog`` starts one and returns what stops it."""
    stops = [start_hog() for _ in range(n)]
    try:
        time.sleep(0.5)
        return timed_task_s(work)
    finally:
        for stop in stops:
            stop()


def launcher_hog(cwd: Path) -> Callable[[], None]:
    return proc.Job(HOG, cwd, time.monotonic() + 600, memory_limit_gb=0).kill


def new_session_hog() -> Callable[[], None]:
    argv, _ = proc._limited(HOG, 0)
    p = subprocess.Popen(argv, start_new_session=True)
    return lambda: (p.kill(), p.wait())


def autogroup() -> str:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return "n/a"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="compiler-like CPU hogs (default: one per core)")
    parser.add_argument("--work", type=int, default=30_000_000, help="loop iterations of the timed task")
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, sched_autogroup_enabled {autogroup()}, hogs {args.hogs}, compile niceness {proc.COMPILE_NICENESS}")
    idle = min(timed_task_s(args.work) for _ in range(2))
    with tempfile.TemporaryDirectory() as tmp:
        launcher = under_load(lambda: launcher_hog(Path(tmp)), args.hogs, args.work)
    old = under_load(new_session_hog, args.hogs, args.work)
    print("| load on the other cores | timed task s | slowdown vs idle |")
    print("|---|---|---|")
    for name, s in (("none", idle), ("hogs via the compile launcher (caller's session, nice 10)", launcher),
                    ("hogs in new sessions, nice 10 (launcher before 2026-11-24)", old)):
        print(f"| {name} | {s:.2f} | {s / idle:.2f}x |")


if __name__ == "__main__":
    main()
