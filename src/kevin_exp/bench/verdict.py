"""The result of evaluating one (problem, candidate) pair."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    OK = "ok"
    FORMAT_ERROR = "format_error"
    FORBIDDEN = "forbidden"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    CRASHED = "crashed"


@dataclass
class TimingStats:
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    p25_ms: float
    p75_ms: float
    trials: int

    @staticmethod
    def from_samples(samples_ms: list[float]) -> "TimingStats":
        import statistics

        s = sorted(samples_ms)
        n = len(s)
        q = statistics.quantiles(s, n=4) if n >= 2 else [s[0]] * 3
        return TimingStats(
            median_ms=statistics.median(s),
            mean_ms=statistics.fmean(s),
            std_ms=statistics.pstdev(s) if n > 1 else 0.0,
            min_ms=s[0],
            max_ms=s[-1],
            p25_ms=q[0],
            p75_ms=q[2],
            trials=n,
        )


@dataclass
class Verdict:
    """One candidate's verdict. ``feedback`` is trimmed to a size fit for a model's next prompt."""

    problem_id: str
    status: Status
    reason: str = ""
    correct: bool = False
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    runtime_stats: TimingStats | None = None
    ref_runtime_stats: TimingStats | None = None
    excessive_speedup: bool = False
    rule: str | None = None
    feedback: str = ""
    device: str = ""
    backend: str = ""
    atol: float | None = None
    rtol: float | None = None
    correctness_trials: int = 0
    max_abs_diff: float | None = None
    compile_s: float = 0.0
    run_s: float = 0.0
    cache_hit: bool = False
    isolation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Verdict":
        d = dict(d)
        d["status"] = Status(d["status"])
        for key in ("runtime_stats", "ref_runtime_stats"):
            if d.get(key) is not None:
                d[key] = TimingStats(**d[key])
        return Verdict(**d)
