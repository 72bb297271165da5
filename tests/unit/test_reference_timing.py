"""The reference timing's cache policy (``bench/reference_timing.py``) on a real ``ReferenceTimings`` in a tmp dir:
measurements are scripted (blocks of timed calls, as the reference process returns them), so each case of the
policy is reached on purpose: quiet, noisy, agreeing and disagreeing measurements, and the cache shared by
processes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.reference_process import ReferenceTimings
from kevin_exp.bench.reference_timing import Measurement, agrees, settle
from kevin_exp.config import EvaluatorConfig
from kevin_exp.settings_checks import check_settings

CONFIG = BenchConfig(reference_max_spread=0.10, reference_agreement=0.05, reference_retries=2, reference_retry_wait_s=0.0)
KEY = "ab" + "0" * 62


def quiet_blocks(ms: float) -> list[list[float]]:
    """Three blocks whose minima are within 2% of each other, the least ``ms``."""
    return [[ms * 1.01, ms * 1.3, ms * 1.2], [ms, ms * 1.1, ms * 1.4], [ms * 1.02, ms * 1.5, ms * 1.1]]


def noisy_blocks(ms: float) -> list[list[float]]:
    """Three blocks whose minima spread by 200%: the machine was busy while they ran."""
    return [[ms, ms * 1.2], [ms * 3.0, ms * 3.5], [ms * 2.0, ms * 2.2]]


class Script:
    """Measurements handed out in order; counts them, and fails the test if more are asked for than scripted.
    ``contention``: the CPU pressure each one saw (None: the kernel does not say)."""

    def __init__(self, *blocks: list[list[float]], statistic: str = "min",
                 contention: tuple[float | None, ...] = ()) -> None:
        self.blocks, self.statistic, self.made = list(blocks), statistic, 0
        self.contention = list(contention) or [None] * len(self.blocks)

    def __call__(self) -> Measurement:
        assert self.made < len(self.blocks), "measured more often than the policy should"
        self.made += 1
        return Measurement.from_blocks(self.blocks[self.made - 1], self.statistic, self.contention[self.made - 1])


def run(timings: ReferenceTimings, script: Script, refresh: bool = False, config: BenchConfig = CONFIG):
    return settle(timings, KEY, script, config, refresh, "cpu", 5.0)


@pytest.fixture
def timings(tmp_path) -> ReferenceTimings:
    return ReferenceTimings(tmp_path)


def test_a_quiet_measurement_is_cached_with_the_statistic_the_speedup_uses(timings):
    m, use, cached = run(timings, Script(quiet_blocks(2.0)))
    assert not cached and m.value == 2.0 and min(m.samples) == 2.0
    assert use["how"] == "fresh" and use["cached"] and not use["noisy"] and use["statistic"] == "min"
    assert use["blocks"] == 3 and use["samples"] == 3 and use["spread"] <= 0.1 and use["measured_at"]
    record = timings.get(KEY)
    assert record["value"] == 2.0 and record["statistic"] == "min"
    again, use, cached = run(timings, Script())  # a hit measures nothing
    assert cached and again.value == 2.0 and use["how"] == "cached" and use["measured_at"] == m.measured_at


def test_the_median_statistic_is_measured_and_cached_as_the_median(timings):
    blocks = [[1.0, 2.0, 3.0], [1.0, 2.02, 3.0], [0.5, 2.01, 9.0]]
    m, use, _ = run(timings, Script(blocks, statistic="median"), config=BenchConfig(timing_statistic="median",
                                                                                    reference_retry_wait_s=0.0))
    assert m.value == 2.0 and m.samples == [1.0, 2.0, 3.0] and use["statistic"] == "median"
    assert timings.get(KEY)["value"] == 2.0


def test_a_noisy_measurement_is_measured_again_and_never_cached(timings):
    script = Script(noisy_blocks(1.0), noisy_blocks(1.2), noisy_blocks(0.9))
    m, use, cached = run(timings, script)
    assert script.made == 3 and not cached and timings.get(KEY) is None
    assert use["noisy"] and not use["cached"] and use["attempts"] == 3 and use["how"] == "fresh"
    # the next run measures again, and caches the first quiet measurement
    script = Script(noisy_blocks(1.0), quiet_blocks(1.0))
    m, use, _ = run(timings, script)
    assert script.made == 2 and use["cached"] and not use["noisy"] and use["attempts"] == 2
    assert timings.get(KEY)["value"] == 1.0


def test_a_recheck_that_agrees_leaves_the_cached_timing_as_it_is(timings):
    run(timings, Script(quiet_blocks(1.0)))
    m, use, cached = run(timings, Script(quiet_blocks(0.97)), refresh=True)  # within 5%: agrees, even though faster
    assert cached and m.value == 1.0 and timings.get(KEY)["value"] == 1.0
    assert use["recheck"]["measured_ms"] == 0.97 and use["recheck"]["cached_ms"] == 1.0
    assert use["recheck"]["decision"].startswith("agrees")


@pytest.mark.parametrize("new_ms", [3.6, 0.3], ids=["slower", "faster"])
def test_a_disagreeing_recheck_is_recorded_and_a_third_measurement_that_sides_with_the_cache_keeps_it(timings, new_ms):
    run(timings, Script(quiet_blocks(1.0)))
    script = Script(quiet_blocks(new_ms), quiet_blocks(1.02))
    m, use, cached = run(timings, script, refresh=True)
    assert script.made == 2 and cached and m.value == 1.0
    check = use["recheck"]
    assert check["measured_ms"] == new_ms and check["third_ms"] == 1.02 and "stands" in check["decision"]
    record = timings.get(KEY)
    assert record["value"] == 1.0 and record["disagreements"][-1]["measured_ms"] == new_ms


def test_a_disagreeing_recheck_replaces_the_cache_only_when_a_third_measurement_sides_with_it(timings):
    run(timings, Script(quiet_blocks(1.0)))
    script = Script(quiet_blocks(1.5), quiet_blocks(1.52))
    m, use, cached = run(timings, script, refresh=True)
    assert not cached and m.value in (1.5, 1.52) and use["how"] == "re-measured" and "replaces" in use["recheck"]["decision"]
    record = timings.get(KEY)
    assert record["value"] == m.value and record["disagreements"][-1]["cached_ms"] == 1.0


def test_noisy_measurements_never_replace_the_cached_timing(timings):
    run(timings, Script(quiet_blocks(1.0)))
    # each noisy measurement is made again (retries) before the policy gives up on a quiet one
    script = Script(*[noisy_blocks(3.0)] * 6)
    m, use, cached = run(timings, script, refresh=True)
    assert cached and m.value == 1.0 and timings.get(KEY)["value"] == 1.0 and "noisy" in use["recheck"]["decision"]


def test_a_third_measurement_that_agrees_with_neither_leaves_the_quietest(timings):
    run(timings, Script([[1.0], [1.08], [1.05]]))  # spread 8%: quiet, but less so than the next two
    script = Script([[2.0], [2.0], [2.01]], [[3.0], [3.0], [3.0]])
    m, use, _ = run(timings, script, refresh=True)
    assert m.value == 3.0 and timings.get(KEY)["value"] == 3.0 and "quietest" in use["recheck"]["decision"]


def test_a_timing_cached_under_a_looser_spread_is_not_used(timings):
    run(timings, Script([[1.0], [1.3], [1.2]]), config=BenchConfig(reference_max_spread=0.5))
    assert timings.get(KEY)["spread"] == pytest.approx(0.3)
    script = Script(quiet_blocks(1.1))
    m, use, cached = run(timings, script)
    assert script.made == 1 and not cached and m.value == 1.1


def test_the_cache_refuses_torn_older_or_inconsistent_records(timings):
    run(timings, Script(quiet_blocks(1.0)))
    path = timings._path(KEY)
    text = path.read_text()
    for bad in (text[: len(text) // 2], json.dumps({"ms": [1.0, 2.0]}),  # cut; the old format
                json.dumps({**json.loads(text), "value": 0.5}), "[]"):  # a value that is not its samples' statistic
        path.write_text(bad)
        assert timings.get(KEY) is None
    with pytest.raises(ValueError):
        timings.put(KEY, {"ms": [1.0], "value": 0.1, "spread": 0.0, "statistic": "min"})


def test_readers_never_see_a_partly_written_record(timings):
    records = [Measurement.from_blocks(quiet_blocks(ms), "min").record("fresh") for ms in (1.0, 2.0, 3.0)]
    for r in records:
        r["ms"] = r["ms"] * 3000  # large enough that a write is not one system call
    timings.put(KEY, records[0])
    stop, seen = threading.Event(), []

    def write(record):
        while not stop.is_set():
            timings.put(KEY, record)

    writers = [threading.Thread(target=write, args=(r,)) for r in records]
    for w in writers:
        w.start()
    try:
        for _ in range(300):
            seen.append(timings.get(KEY))
    finally:
        stop.set()
        for w in writers:
            w.join()
    assert all(r is not None and r["value"] in (1.0, 2.0, 3.0) for r in seen)
    assert not [p for p in timings.root.rglob("*.tmp")]


def test_a_job_that_finds_another_measuring_waits_and_uses_its_timing(timings, tmp_path):
    """Another process holds the cache's lock while it measures and caches; this one, asking meanwhile, measures
    nothing and uses that timing."""
    holder = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from kevin_exp.bench.reference_process import ReferenceTimings
        from kevin_exp.bench.reference_timing import Measurement
        t = ReferenceTimings(Path({str(tmp_path)!r}))
        with t.measuring("cpu", 5.0) as held:
            assert held
            print("holding", flush=True)
            time.sleep(1.5)
            t.put({KEY!r}, Measurement.from_blocks({quiet_blocks(4.0)!r}, "min").record("fresh"))
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        m, use, cached = run(timings, Script())
        assert cached and m.value == 4.0 and use["lock_held"]
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_a_lock_held_too_long_is_waited_for_only_so_long(timings):
    with timings.measuring("cpu", 1.0) as first:
        with timings.measuring("cpu", 0.2) as second:
            assert first and not second


def test_only_the_evaluators_uid_can_open_the_lock(timings):
    """A sandboxed runner sees the cache read-only, under another uid: it must not be able to open the lock (flock
    needs no write access) and hold it to stall every reference timing on the machine."""
    timings.root.mkdir(parents=True)
    loose = timings.root / ".measuring-cpu.lock"
    loose.touch(mode=0o644)
    with timings.measuring("cpu", 1.0):
        pass
    assert loose.stat().st_mode & 0o077 == 0


def test_agreement_is_relative():
    assert agrees(1.0, 1.05, 0.05) and agrees(1.05, 1.0, 0.05) and not agrees(1.0, 1.06, 0.05)


def test_settings_are_validated_and_mirrored():
    for bad in (dict(reference_max_spread=-0.1), dict(reference_agreement=-1.0), dict(reference_retries=-1),
                dict(reference_retry_wait_s=-0.5)):
        with pytest.raises(ValueError):
            BenchConfig(**bad)
    cfg = EvaluatorConfig(backend="cpu", reference_max_spread=0.2, reference_agreement=0.1, reference_retries=4,
                          reference_retry_wait_s=0.5)
    bench = cfg.to_bench()
    assert (bench.reference_max_spread, bench.reference_agreement, bench.reference_retries,
            bench.reference_retry_wait_s) == (0.2, 0.1, 4, 0.5)
    problems = check_settings(EvaluatorConfig(reference_max_spread=-0.1, reference_retries=-1))
    assert any("reference_max_spread" in p for p in problems) and any("reference_retries" in p for p in problems)


def test_a_max_spread_of_zero_is_the_backends_own():
    assert BenchConfig(backend="cuda").max_reference_spread == 0.10
    assert BenchConfig(backend="cpu").max_reference_spread == 0.30
    assert BenchConfig(backend="cpu", reference_max_spread=0.05).max_reference_spread == 0.05


def test_a_measurement_on_oversubscribed_cores_is_not_cached_however_low_its_spread(timings):
    """Compiles beside the reference on 2 cores slowed every block alike (0.45 ms measured at 62 ms): the spread
    is low, the CPU pressure is not. Measured again while contended; the least contended is used for this run
    only, and a later quiet measurement is cached."""
    busy = Script(quiet_blocks(62.0), quiet_blocks(60.0), quiet_blocks(61.0), contention=(0.95, 0.9, 0.97))
    m, use, cached = run(timings, busy)
    assert busy.made == 3 and not cached and m.value == 60.0 and m.contention == 0.9
    assert use["noisy"] and not use["cached"] and use["contention"] == 0.9 and use["max_contention"] == 0.25
    assert timings.get(KEY) is None
    calm = Script(quiet_blocks(0.45), contention=(0.05,))
    m, use, cached = run(timings, calm)
    assert m.value == 0.45 and use["cached"] and not use["noisy"] and timings.get(KEY)["contention"] == 0.05
    # on a kernel without pressure information a measurement is judged by its spread alone
    assert Measurement.from_blocks(quiet_blocks(1.0), "min").quiet(CONFIG)


def test_a_timing_cached_before_the_pressure_was_recorded_is_measured_again_once(timings):
    run(timings, Script(quiet_blocks(55.0)))
    old = {k: v for k, v in timings.get(KEY).items() if k != "contention"}
    timings.put(KEY, old)
    again = Script(quiet_blocks(0.8), contention=(0.02,))
    m, _, cached = run(timings, again)
    assert again.made == 1 and m.value == 0.8 and not cached and timings.get(KEY)["contention"] == 0.02
    m, _, cached = run(timings, Script())  # now cached with it: not measured again
    assert cached and m.value == 0.8


def test_a_timing_cached_under_a_looser_contention_limit_is_measured_again(timings):
    loose = BenchConfig(**{**CONFIG.__dict__, "reference_max_contention": 1.0})
    run(timings, Script(quiet_blocks(5.0), contention=(0.8,)), config=loose)
    assert timings.get(KEY)["value"] == 5.0
    again = Script(quiet_blocks(0.5), contention=(0.0,))
    m, _, cached = run(timings, again)
    assert again.made == 1 and m.value == 0.5 and not cached and timings.get(KEY)["value"] == 0.5
    with pytest.raises(ValueError, match="reference_max_contention"):
        BenchConfig(reference_max_contention=2.0)
