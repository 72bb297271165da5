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
