"""How the reference's time is measured, cached and measured again (docs/hack_defences.md, "Timing protocol").

A measurement is ``REFERENCE_TIMING_BLOCKS`` blocks of timed calls in the trusted reference process; each block is
reduced with the statistic the speedup uses (``timing_statistic``: min or median) and the block with the least value
is kept (the quietest). Its spread is the relative spread of the blocks' values, ``(max - min) / min``: how far the
figure a speedup divides by moved while it was measured. Only a measurement whose spread is at most
``reference_max_spread``, made while some task waited for a CPU during at most ``reference_max_contention`` of its
wall time (oversubscribed cores slow every block alike, so the spread cannot tell), is cached; a noisier one is
measured again (``reference_retries`` times, ``reference_retry_wait_s`` apart) and, if none is quiet, the quietest
is used for this run alone and the verdict says so (``noisy``). A recheck measures again: a measurement that agrees
with the cached one (within the relative ``reference_agreement``) leaves it as it is; one that disagrees is
recorded, and a third measurement decides (it sides with the cached one: kept; with the new one: the quieter of the
two agreeing replaces it; with neither: the quietest of the three by spread), so the cached figure never moves
silently, up or down.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.reference_process import ReferenceTimings

REFERENCE_TIMING_BLOCKS = 3
KEEP_DISAGREEMENTS = 20  # disagreements kept in a cache record, latest last


@dataclass
class Measurement:
    samples: list[float]  # the kept block's timed calls (ms)
    statistic: str
    value: float  # the kept block's statistic: the figure a speedup divides by
    spread: float  # (max - min) / min of the blocks' statistics
    block_ms: list[float]  # each block's statistic
    sample_iqr: float  # (p75 - p25) / median of the kept block's calls (for the record)
    measured_at: str  # UTC, ISO 8601
    attempts: int = 1  # measurements made to get this one (more when earlier ones were noisy)
    # the share of its wall time during which some task waited for a CPU (None: the kernel does not say)
    contention: float | None = None

    @staticmethod
    def from_blocks(blocks: list[list[float]], statistic: str, contention: float | None = None) -> "Measurement":
        values = [_statistic(b, statistic) for b in blocks]
        kept = min(range(len(blocks)), key=values.__getitem__)
        low = values[kept]
        spread = (max(values) - low) / low if low > 0 else (0.0 if max(values) == low else float("inf"))
        samples = blocks[kept]
        median = statistics.median(samples)
        quartiles = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
        iqr = (quartiles[2] - quartiles[0]) / median if median > 0 else 0.0
        return Measurement(samples, statistic, low, spread, values, iqr, _now(), contention=contention)

    @staticmethod
    def from_record(record: dict[str, Any]) -> "Measurement":
        return Measurement([float(x) for x in record["ms"]], record["statistic"], float(record["value"]),
                           float(record["spread"]), [float(x) for x in record.get("block_ms") or []],
                           float(record.get("sample_iqr") or 0.0), str(record.get("measured_at") or ""),
                           int(record.get("attempts") or 1), record.get("contention"))

    def record(self, how: str) -> dict[str, Any]:
        """What the cache keeps (``ReferenceTimings.put``)."""
        return {"ms": self.samples, "statistic": self.statistic, "value": self.value, "spread": self.spread,
                "block_ms": self.block_ms, "sample_iqr": self.sample_iqr, "measured_at": self.measured_at,
                "attempts": self.attempts, "contention": self.contention, "how": how}

    def quiet(self, config: BenchConfig) -> bool:
        """Low spread between the blocks, and the CPUs not oversubscribed while they ran (which slows every block
        alike: the spread cannot tell)."""
        contended = self.contention is not None and self.contention > config.reference_max_contention
        return self.spread <= config.max_reference_spread and not contended

    def noise(self) -> tuple[float, float]:
        """How far from quiet it is, for choosing the quietest of several: contention first, then spread."""
        return (self.contention or 0.0, self.spread)


def measure_quietly(measure: Callable[[], Measurement], config: BenchConfig) -> Measurement:
    """A measurement, made again while it is noisy (at most ``reference_retries`` more times, with a wait between):
    the first quiet one, else the quietest."""
    best: Measurement | None = None
    attempts = 0
    for attempt in range(1 + config.reference_retries):
        if attempt:
            time.sleep(config.reference_retry_wait_s)
        m = measure()
        attempts += 1
        if m.quiet(config):
            best = m
            break
        if best is None or m.noise() < best.noise():
            best = m
    assert best is not None
    best.attempts = attempts
    return best


def agrees(a: float, b: float, tolerance: float) -> bool:
    """Whether two reference times are within the relative ``tolerance`` of each other."""
    low = min(a, b)
    return abs(a - b) <= tolerance * low * (1 + 1e-9) if low > 0 else a == b


def settle(timings: ReferenceTimings, key: str, measure: Callable[[], Measurement], config: BenchConfig,
           refresh: bool, lock_name: str, lock_timeout_s: float) -> tuple[Measurement, dict[str, Any], bool]:
    """The reference timing a run uses: the cached one, or a new measurement (cached when quiet); with ``refresh``
    (a recheck) measured again and settled against the cached one. Gives the measurement, its record for the
    verdict (``extra["reference"]``), and whether it is the cached one. Under the cache's lock, so jobs sharing
    the cache neither measure at once nor both measure a reference the other is measuring."""
    with timings.measuring(lock_name, lock_timeout_s) as locked:
        record = timings.get(key)
        if record is not None and "contention" not in record:
            record = None  # cached before the CPU pressure was recorded: measured again, once
        if record is not None and not Measurement.from_record(record).quiet(config):
            record = None  # cached under a looser setting: not quiet by this one
        if record is not None and not refresh:
            cached = Measurement.from_record(record)
            return cached, _use(cached, "cached", config, stored=True, locked=locked), True
        new = measure_quietly(measure, config)
        if record is None:
            stored = new.quiet(config)
            if stored:
                timings.put(key, new.record("fresh"))
            return new, _use(new, "fresh", config, stored=stored, locked=locked), False
        cached = Measurement.from_record(record)
        check: dict[str, Any] = {"cached_ms": cached.value, "cached_spread": round(cached.spread, 6),
                                 "measured_ms": new.value, "measured_spread": round(new.spread, 6),
                                 "agreement": config.reference_agreement}
        if agrees(new.value, cached.value, config.reference_agreement):
            check["decision"] = "agrees: the cached timing stands"
            return cached, _use(cached, "cached", config, stored=True, locked=locked, recheck=check), True
        third = measure_quietly(measure, config)
        check.update(third_ms=third.value, third_spread=round(third.spread, 6))
        chosen, check["decision"] = _decide(cached, new, third, config)
        check["at"] = _now()
        history = (list(record.get("disagreements") or []) + [check])[-KEEP_DISAGREEMENTS:]
        if chosen is cached:
            timings.put(key, {**record, "disagreements": history})
            return cached, _use(cached, "cached", config, stored=True, locked=locked, recheck=check), True
        timings.put(key, {**chosen.record("re-measured"), "disagreements": history})
        return chosen, _use(chosen, "re-measured", config, stored=True, locked=locked, recheck=check), False


def _decide(cached: Measurement, new: Measurement, third: Measurement, config: BenchConfig) -> tuple[Measurement, str]:
    """After a new measurement disagreed with the cached one: which stands, and why."""
    tol = config.reference_agreement
    if agrees(third.value, cached.value, tol):
        return cached, "disagrees; a third measurement agrees with the cached timing, which stands"
    if agrees(third.value, new.value, tol):
        quiet = [m for m in (new, third) if m.quiet(config)]
        if not quiet:
            return cached, "disagrees; a third measurement agrees with the new one, but both are noisy: the cached timing stands"
        return min(quiet, key=Measurement.noise), "disagrees; a third measurement agrees with the new one, which replaces it"
    quietest = min((cached, new, third), key=Measurement.noise)
    if quietest is cached or not quietest.quiet(config):
        return cached, "disagrees; the third agrees with neither, and the cached timing is the quietest: it stands"
    return quietest, "disagrees; the third agrees with neither: the quietest of the three by spread replaces it"


def _use(m: Measurement, how: str, config: BenchConfig, *, stored: bool, locked: bool,
         recheck: dict[str, Any] | None = None) -> dict[str, Any]:
    """The verdict's record of the reference timing it used."""
    use: dict[str, Any] = {"value_ms": m.value, "statistic": m.statistic, "how": how, "measured_at": m.measured_at,
                           "spread": round(m.spread, 6), "max_spread": config.max_reference_spread,
                           "contention": m.contention, "max_contention": config.reference_max_contention,
                           "noisy": not m.quiet(config), "cached": stored, "blocks": len(m.block_ms),
                           "block_ms": [round(x, 6) for x in m.block_ms], "samples": len(m.samples),
                           "sample_iqr": round(m.sample_iqr, 6), "attempts": m.attempts, "lock_held": locked}
    if recheck is not None:
        use["recheck"] = recheck
    return use


def _statistic(samples: list[float], name: str) -> float:
    return min(samples) if name == "min" else statistics.median(samples)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
