"""The machine's CPU pressure as the hidden-time check reads it (bench/cpu_pressure.py)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from kevin_exp.bench import cpu_pressure

LINES = "some avg10=0.42 avg60=23.64 avg300=14.02 total={}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_the_stall_total_is_read_from_the_some_line(tmp_path: Path):
    path = tmp_path / "cpu"
    path.write_text(LINES.format(9961970386))
    assert cpu_pressure.stall_us(path) == 9961970386
    assert cpu_pressure.stall_us(tmp_path / "absent") is None  # a kernel without PSI
    path.write_text("garbage\n")
    assert cpu_pressure.stall_us(path) is None


def test_a_window_gives_the_share_of_its_wall_time_some_task_waited(tmp_path: Path):
    path = tmp_path / "cpu"
    path.write_text(LINES.format(1_000_000))
    window = cpu_pressure.Window(path)
    time.sleep(0.2)
    path.write_text(LINES.format(1_000_000 + 100_000))  # 0.1 s of stall in about 0.2 s
    assert window.share() == pytest.approx(0.5, abs=0.1)
    path.write_text(LINES.format(1_000_000 + 10_000_000))  # more stall than wall time: at most all of it
    assert window.share() == 1.0
    path.unlink()
    assert window.share() is None


def test_this_machines_pressure_is_read_where_the_kernel_has_it():
    if not cpu_pressure.PRESSURE_FILE.exists():
        assert cpu_pressure.stall_us() is None and cpu_pressure.Window().share() is None
        return
    window = cpu_pressure.Window()
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        pass
    share = window.share()
    assert share is not None and 0.0 <= share <= 1.0
