"""The device gate between a slot's timed calls and its starting runners, with real processes holding it."""
from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import time

import pytest

from kevin_exp.bench.device_gate import DeviceGate

HOLD = """
import os, sys, time
from kevin_exp.bench.device_gate import starting_on_the_device
fd = int(sys.argv[1])
with starting_on_the_device(fd):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
try:
    os.fstat(fd)
    print("still open")
except OSError:
    print("closed", flush=True)
time.sleep(float(sys.argv[3]))  # lives on, as a runner waiting for its candidate does
"""


# the sandbox launcher forks the runner and waits for it, holding its own copy of every descriptor passed on
LAUNCHER = """
import subprocess, sys
sys.exit(subprocess.run(sys.argv[1:], pass_fds=(int(sys.argv[4]),)).returncode)
"""


def start_runner(gate: DeviceGate, hold_s: float, live_s: float = 0.0) -> subprocess.Popen:
    fd = gate.runner_fd()
    try:
        return subprocess.Popen([sys.executable, "-c", LAUNCHER, sys.executable, "-c", HOLD, str(fd), str(hold_s),
                                 str(live_s)],
                                pass_fds=(fd,), stdout=subprocess.PIPE, text=True)
    finally:
        os.close(fd)


@pytest.fixture
def gate(tmp_path):
    g = DeviceGate(tmp_path / "run" / "device-gate-0", wait_s=30.0)
    yield g
    g.close()


def test_a_timed_run_waits_for_a_runner_starting_cuda_and_the_runner_lets_go_for_good(gate):
    runner = start_runner(gate, 0.6)
    assert runner.stdout.readline().strip() == "holding"
    with gate.quiet() as waited:
        assert waited > 0.2  # the runner still held it when the run asked
        assert runner.wait(timeout=10) == 0
    assert runner.stdout.read().strip() == "closed"  # the runner's own description, closed after its start-up


def test_a_runner_lets_go_after_its_start_up_though_its_launcher_keeps_a_copy(gate):
    runner = start_runner(gate, 0.0, live_s=3.0)
    assert runner.stdout.readline().strip() == "holding"
    assert runner.stdout.readline().strip() == "closed"  # started up; the launcher and the runner live on
    with gate.quiet() as waited:
        assert waited < 1.0 and runner.poll() is None
    runner.wait(timeout=10)


def test_a_runner_starting_while_a_candidate_is_timed_waits_until_the_timing_ends(gate):
    with gate.quiet() as waited:
        assert waited < 5
        runner = start_runner(gate, 0.0)
        time.sleep(0.5)
        assert runner.poll() is None  # blocked on the gate: it has not printed, nor exited
        assert select.select([runner.stdout], [], [], 0)[0] == []
    assert runner.stdout.readline().strip() == "holding"
    assert runner.wait(timeout=10) == 0


def test_a_runner_stuck_in_its_start_up_delays_a_run_only_up_to_the_limit(tmp_path):
    gate = DeviceGate(tmp_path / "gate", wait_s=0.3)
    fd = gate.runner_fd()
    fcntl.flock(fd, fcntl.LOCK_SH)  # a runner that never finishes starting
    try:
        with gate.quiet() as waited:
            assert 0.3 <= waited < 5
    finally:
        os.close(fd)
        gate.close()


HARNESS_WATCH = """
import os, sys
import kevin_exp.bench.worker.runner as runner

made = runner.warm_harness


def watched(*args, **kwargs):
    # this process's shared lock on the gate, as /proc/locks lists it ("1: FLOCK ADVISORY READ <pid> ...")
    held = any(f[1:4] == ["FLOCK", "ADVISORY", "READ"] and f[4] == str(os.getpid()) for f in map(str.split, open("/proc/locks")))
    print("harness made under the gate:", held, flush=True)
    return made(*args, **kwargs)


runner.warm_harness = watched
from kevin_exp.bench.worker.entry import main
main(sys.argv[1:])
"""


def test_a_standby_runner_makes_its_harness_under_the_gate(tmp_path):
    """A runner's start-up does all its device work under the gate: on cuda CUDA's start and warm-up kernels, and
    the harness (the flush buffer, the exchange mapped and page-locked), which must never happen beside a timed
    call. The same start-up path runs on the cpu backend; here it reports whether it held the gate then."""
    from kevin_exp.bench.exchange import new_exchange_fd

    gate = DeviceGate(tmp_path / "gate", wait_s=30.0)
    exchange = new_exchange_fd(1 << 20)
    read_fd, write_fd = os.pipe()
    gate_fd = gate.runner_fd()
    runner = subprocess.Popen([sys.executable, "-c", HARNESS_WATCH, "--reply-fd", str(write_fd), "--exchange-fd",
                               str(exchange), "--backend", "cpu", "--workdir", str(tmp_path / "work"),
                               "--device-gate-fd", str(gate_fd)],
                              pass_fds=(write_fd, exchange, gate_fd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        for fd in (write_fd, gate_fd):
            os.close(fd)
        assert runner.stdout.readline().strip() == "harness made under the gate: True"
        assert select.select([read_fd], [], [], 120)[0] and b'"op": "ready"' in os.read(read_fd, 1 << 16)
        with gate.quiet() as waited:  # and it let go before saying ready
            assert waited < 1.0
    finally:
        runner.kill()
        runner.wait()
        for fd in (read_fd, exchange):
            os.close(fd)
        gate.close()
