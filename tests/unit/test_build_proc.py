"""Compiler processes run with the builder's limits: lower CPU priority, no core dumps, an address-space cap."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kevin_exp.bench.build import proc

# what a compiler sees: its niceness, its core-size limit and its address-space limit (KiB)
PROBE = ["sh", "-c", "nice; ulimit -c; ulimit -v"]


def expected_niceness() -> int:
    return min(19, os.nice(0) + proc.COMPILE_NICENESS)


def probe(tmp_path: Path) -> list[str]:
    res = proc.run(PROBE, tmp_path, time.monotonic() + 30, memory_limit_gb=2.0)
    assert res.ok, res.describe()
    return res.output.split()


def test_compiles_run_below_the_callers_priority_with_limits(tmp_path: Path) -> None:
    niceness, core, address_space = probe(tmp_path)
    assert int(niceness) == expected_niceness()
    assert core == "0"
    assert int(address_space) == 2 * 1024 * 1024


def test_the_same_limits_apply_without_prlimit_or_nice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "_PRLIMIT", None)
    niceness, core, address_space = probe(tmp_path)
    assert int(niceness) == expected_niceness()
    assert core == "0"
    assert int(address_space) == 2 * 1024 * 1024


def test_the_callers_priority_is_unchanged(tmp_path: Path) -> None:
    before = os.nice(0)
    probe(tmp_path)
    assert os.nice(0) == before


@pytest.mark.parametrize("with_prlimit", [True, False])
def test_compiles_share_the_callers_session_so_their_niceness_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_prlimit: bool
) -> None:
    # Under autogroup scheduling each session is its own scheduling group and niceness only ranks tasks
    # within one: a compiler in a new session would compete with the run worker as an equal. Seen from
    # outside: inside a sandbox's PID namespace the session and group leaders are not visible.
    if not with_prlimit:
        monkeypatch.setattr(proc, "_PRLIMIT", None)
    job = proc.Job(["sleep", "30"], tmp_path, time.monotonic() + 30, 0)
    try:
        tree = wait_for(lambda: descendants(job.proc.pid) if any(cmdline(p)[:1] == ["sleep"] for p in descendants(job.proc.pid)) else None)
        for pid in [job.proc.pid, *tree]:
            assert os.getsid(pid) == os.getsid(0)
            # its own process group all the same, so a timeout kills the compiler and every child it started
            assert os.getpgid(pid) == job.proc.pid != os.getpgid(0)
    finally:
        job.kill()
        job.wait()


def test_a_timed_out_compile_is_killed_with_its_children(tmp_path: Path) -> None:
    tag = f"{600 + os.getpid() % 1000}.{time.time_ns() % 1000 + 1}"
    res = proc.run(["sh", "-c", f"sleep {tag} & wait"], tmp_path, time.monotonic() + 1.0, memory_limit_gb=0)
    assert res.timed_out and not res.ok
    deadline = time.monotonic() + 5
    while sleeping(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not sleeping(tag), "the compiler's child outlived the timeout"


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def sleeping(tag: str) -> bool:
    return any(cmdline(int(e.name)) == ["sleep", tag] and running(int(e.name)) for e in os.scandir("/proc") if e.name.isdigit())


def descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                parents[int(e.name)] = int(Path(f"/proc/{e.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parents.items() if p == pid]
        found += kids
        frontier += kids
    return found


def wait_for(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
