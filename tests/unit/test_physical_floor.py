"""The physical floor: its arithmetic (bytes beyond twice the caches over bandwidth x margin, FLOPs over peak), the
verdict it gives a time below it, and the figures the reference process measures on this machine."""
from __future__ import annotations

import pytest

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.physical_floor import below_floor, cpu_cache_bytes, floor_record, machine_figures
from kevin_exp.bench.run_outcome import RunOutcome
from kevin_exp.bench.verdict import Status, verdict_from_run

MIB = 1 << 20


def tensor(nbytes: int) -> dict:
    return {"t": "tensor", "dtype": "float32", "shape": [nbytes // 4], "offset": 0, "nbytes": nbytes}


FIGURES = {"bandwidth_gbs": 100.0, "bandwidth_source": "measured copy", "cache_bytes": 32 * MIB, "peak_tflops": None,
           "flops": 0.0}


def test_only_bytes_beyond_twice_the_caches_count_and_the_margin_divides():
    rec = floor_record(FIGURES, tensor(256 * MIB), tensor(256 * MIB), "cpu", 0.0, 0.0)
    assert rec["bytes"] == 512 * MIB and rec["bytes_beyond_cache"] == 448 * MIB and rec["margin"] == 4.0
    assert rec["floor_ms"] == pytest.approx(448 * MIB / (100e9 * 4) * 1e3, rel=1e-5)
    small = floor_record(FIGURES, tensor(16 * MIB), tensor(16 * MIB), "cpu", 0.0, 0.0)
    assert small["bytes_beyond_cache"] == 0 and small["floor_ms"] == 0.0 and not below_floor(small, 1e-9)
    # a setting replaces the machine's bandwidth; cuda's margin is smaller
    rec = floor_record(FIGURES, tensor(256 * MIB), tensor(256 * MIB), "cuda", 10.0, 0.0)
    assert rec["bandwidth_source"] == "setting" and rec["margin"] == 1.5
    assert rec["floor_ms"] == pytest.approx(448 * MIB / (10e9 * 1.5) * 1e3, rel=1e-5)
    assert floor_record(None, tensor(1), tensor(1), "cpu", 0.0, 0.0) is None
    assert floor_record({**FIGURES, "bandwidth_gbs": None}, tensor(1), tensor(1), "cpu", 0.0, 0.0) is None


def test_flops_over_the_peak_raise_the_floor_where_both_are_known():
    figures = {**FIGURES, "cache_bytes": 1 << 30, "flops": 2 * 4096.0 ** 3, "peak_tflops": 1979.0}
    rec = floor_record(figures, tensor(MIB), tensor(MIB), "cuda", 0.0, 1.0)
    assert rec["bytes_floor_ms"] == 0.0 and rec["flops_floor_ms"] == pytest.approx(2 * 4096.0 ** 3 / 1979e12 * 1e3, rel=1e-4)
    assert rec["floor_ms"] == rec["flops_floor_ms"]


def _outcome(new_ms: float, floor: dict | None) -> RunOutcome:
    return RunOutcome(device="cpu: test", limits={"trials_s": 10.0}, correctness_trials=3, new_ms=[new_ms] * 3,
                      ref_ms=[50.0] * 3, outside_ms=[new_ms + 0.2] * 3, floor=floor)


def _verdict(o: RunOutcome):
    return verdict_from_run("p", o, BenchConfig(), isolation="test", compile_s=0.0, run_s=0.0, cache_hit=False)


def test_a_time_below_the_floor_is_suspect_with_both_numbers_in_the_record():
    rec = floor_record(FIGURES, tensor(256 * MIB), tensor(256 * MIB), "cpu", 0.0, 0.0)  # about 1.17 ms
    v = _verdict(_outcome(0.5, rec))
    assert v.status is Status.SUSPECT and v.rule == "below_physical_floor" and not v.correct
    assert v.extra["floor"]["floor_ms"] == rec["floor_ms"] and v.extra["floor"]["runtime_ms"] == 0.5
    assert v.extra["floor"]["bytes"] == 512 * MIB and v.extra["floor"]["bandwidth_gbs"] == 100.0
    assert "physical floor" in v.reason
    above = _verdict(_outcome(2.0, rec))
    assert above.status is Status.OK and above.extra["floor"]["runtime_ms"] == 2.0
    # physical_floor off: the protocol leaves no floor, the verdict has none
    off = _verdict(_outcome(0.5, None))
    assert off.status is Status.OK and "floor" not in off.extra


def test_this_machines_figures_are_measured_once_and_positive():
    figures = machine_figures(type("D", (), {"type": "cpu"})())
    assert figures["bandwidth_source"] == "measured copy" and figures["bandwidth_gbs"] > 0.1
    assert figures["cache_bytes"] == cpu_cache_bytes() > 0 and figures["peak_tflops"] is None


def test_settings_are_validated():
    with pytest.raises(ValueError, match="floor_margin"):
        BenchConfig(floor_margin=0.5)
    with pytest.raises(ValueError, match="floor_bandwidth_gbs"):
        BenchConfig(floor_bandwidth_gbs=-1.0)
    BenchConfig(floor_margin=0.0, floor_bandwidth_gbs=0.0)


@pytest.mark.parametrize("override, message", [
    ("evaluator.floor_margin=0.5", "evaluator.floor_margin=0.5: expected 0 (the backend's) or >= 1"),
    ("evaluator.floor_bandwidth_gbs=-1", "evaluator.floor_bandwidth_gbs=-1.0: expected >= 0"),
])
def test_the_run_config_checks_the_floor_settings(override, message):
    from kevin_exp.config import ConfigError
    from tests.helpers import compose_train

    with pytest.raises(ConfigError) as caught:
        compose_train([override])
    assert message in str(caught.value)


def test_the_run_config_passes_every_new_setting_to_the_evaluator():
    from tests.helpers import compose_train

    bench = compose_train(["evaluator.check_distributions=false", "evaluator.hidden_shape_check=false",
                           "evaluator.physical_floor=false", "evaluator.floor_bandwidth_gbs=3350",
                           "evaluator.floor_margin=2"]).evaluator.to_bench()
    assert (bench.check_distributions, bench.hidden_shape_check, bench.physical_floor) == (False, False, False)
    assert (bench.floor_bandwidth_gbs, bench.floor_margin) == (3350.0, 2.0) and bench.rules.framework_flags
