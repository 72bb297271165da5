"""Class 7 and 10: the reference's time, which every speedup divides by, measured on a busy machine. A recheck used
to replace the cached time whenever it measured again, so on a loaded box the cached figure (and with it every
later verdict of that problem) drifted; and a reference measured while the machine was busy was cached for good.

The attack: a candidate that cannot slow the reference directly (it never runs beside it) leaves the machine
busy while the next problem's reference is timed: its runner holds as much memory as the limit allows, dirtied,
and spins until the hang limit kills it, so the kill's teardown (freeing gigabytes) overlaps the moment the slot
times the reference of the next candidate's fresh problem. A slower reference cached there inflates every honest
speedup on that problem."""
from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import torch

from kevin_exp.bench import Status, cpu_pressure
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.bench.reference_process import ReferenceTimings
from tests.adversarial.attacks import GAIN_BOUND, HONEST, PROBLEM, candidate, config
from tests.adversarial.cuda_attacks import CUDA_CONFIG, HONEST_CUDA, LEAKY_KERNEL, RELU_PROBLEM, cuda_candidate

# a shared 2-core machine's own noise on the fastest of 12 calls of a 0.3 ms kernel is 10-30% between blocks
# (measured with nothing else of ours running), so these tests allow that much; the defaults (10% spread, 5%
# agreement) are the fidelity goal's, for the GPU
BOX = dict(reference_max_spread=0.3, reference_agreement=0.3, reference_retries=2, reference_retry_wait_s=0.5)

HOLD_AND_SPIN = candidate(r"""
static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

torch::Tensor leaky(torch::Tensor x) {
    // as much memory as the limit allows, every page dirtied: the kill that ends this runner takes a while too
    auto hold = torch::empty({(int64_t)640 * 1024 * 1024}, x.options());
    float* p = hold.data_ptr<float>();
    for (int64_t i = 0; i < hold.numel(); i += 1024) p[i] = 1.f;
    volatile unsigned long sink = 0;
    while (true) sink = sink + 1;
    auto out = torch::empty_like(x);
    leaky_into(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}
""", name="adv_hold_and_spin")

# the cuda twin: a kernel on every SM that never ends; forward returns at once and the runner is killed when the
# call's limit is reached (a timer that synchronises the device never returns)
SPIN_ON_EVERY_SM = cuda_candidate(LEAKY_KERNEL + r"""
__device__ volatile int released = 0;  // nothing ever sets it

__global__ void spin_kernel(const float* x, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    while (!released) { }
    if (i < n) out[i] = x[i];
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    spin_kernel<<<132 * 16, 1024, 0, torch_stream()>>>(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}
""", name="adv_cuda_spin_past_kill")


def fresh_problem(tag: str, problem: str = PROBLEM) -> str:
    """A problem under a source of its own: a reference timing no earlier evaluation has cached."""
    return problem + f"\n# {tag} {uuid.uuid4().hex}\n"


def cached_record(cfg, problem: str, device: str) -> dict | None:
    timings = ReferenceTimings(cfg.resolved_cache_dir())
    return timings.get(timings.key(problem, cfg.backend, device, torch.__version__, cfg.warmup_trials, cfg.timed_trials,
                                   cfg.timing_statistic))


def assert_reference_recorded(v, cfg) -> dict:
    ref = v.extra.get("reference")
    assert ref, v.extra
    for key in ("value_ms", "statistic", "how", "measured_at", "spread", "noisy", "blocks", "samples", "attempts"):
        assert key in ref, (key, ref)
    assert ref["how"] in ("fresh", "cached", "re-measured") and ref["blocks"] == 3 and ref["samples"] == cfg.timed_trials
    assert abs(ref["value_ms"] - v.ref_runtime_ms) <= 1e-9, (ref, v.ref_runtime_ms)
    return ref


def hang_then_honest(cfg, problem: str, hang: str, honest: str) -> None:
    """The honest kernel on a fresh problem, on a quiet evaluator; then on another fresh problem right after the
    hanging candidate was killed (both builds cached first, so the hang runs first and the honest run, which times
    its problem's reference, comes straight after the kill): the two speedups within GAIN_BOUND of each other,
    and no noisy reference timing cached."""
    quiet_problem, after_problem = fresh_problem("quiet", problem), fresh_problem("after-hang", problem)
    with Evaluator(cfg) as ev:
        [quiet] = ev.evaluate([EvalItem("quiet", quiet_problem, honest)])
    assert quiet.status is Status.OK, quiet.reason
    with Evaluator(cfg) as ev:
        for source in (hang, honest):
            for spec in check_candidate(source, cfg.backend, cfg.rules)[0].specs:
                assert not hasattr(ev._build_future(spec).result(), "log"), "the build failed"
        hanged, after = ev.evaluate([EvalItem("hang", problem, hang), EvalItem("after", after_problem, honest)])
    assert hanged.status is Status.TIMEOUT, hanged.reason
    assert after.status is Status.OK, after.reason
    # what a slowed reference would give the next candidate: a speedup inflated by it (the honest kernel's own time
    # moves with the box's noise, both ways, and is not what this is about)
    assert after.ref_runtime_ms <= GAIN_BOUND * quiet.ref_runtime_ms, (
        f"NOT STOPPED: the honest kernel scored {after.speedup:.3g}x after the hang, {quiet.speedup:.3g}x on a quiet "
        f"evaluator (reference {after.ref_runtime_ms:.4g} ms against {quiet.ref_runtime_ms:.4g} ms)")
    ref = assert_reference_recorded(after, cfg)
    record = cached_record(cfg, after_problem, after.device)
    if ref["noisy"]:
        assert record is None and not ref["cached"], (ref, record)  # used for this verdict alone, and said so
    if record is not None:
        assert record["spread"] <= cfg.max_reference_spread, record


def test_a_hanging_candidate_does_not_leave_the_next_problems_reference_slow(build_cache):
    cfg = config(build_cache, hang_s=8.0, memory_limit_gb=4.0, recheck_speedup=1e9, **BOX)
    for attempt in range(2):  # measured again on a failure, like judge(): a busy 2-core box's noise rarely repeats
        try:
            hang_then_honest(cfg, PROBLEM, HOLD_AND_SPIN, HONEST)
            return
        except AssertionError:
            if attempt == 1:
                raise


@pytest.mark.gpu
def test_a_kernel_left_spinning_on_the_device_does_not_slow_the_next_problems_reference(build_cache):
    """On cuda a killed runner's context, and the kernel it left spinning on every SM, lasts until the driver tears
    it down, after the kill, off the slot's critical path: the slot's next reference timing must wait for that."""
    cfg = config(build_cache, **{**CUDA_CONFIG, "recheck_speedup": 1e9})
    hang_then_honest(cfg, RELU_PROBLEM, SPIN_ON_EVERY_SM, HONEST_CUDA)


def test_rechecked_reference_does_not_drift_on_a_loaded_box(build_cache):
    """Every verdict is re-checked (recheck_speedup below any speedup), each recheck measures the reference again,
    and the box is loaded by two spinning processes for the whole test. A reference timed while the box is evenly
    loaded can be quiet and still slow, so a recheck may correct it once; what must not happen is drift: the cached
    figure changes only when a recheck disagreed and a third measurement confirmed the new figure (both recorded in
    the cache's history), at most once in six rechecks, and it stands afterwards. Every verdict records the
    reference timings it used. The CPU-pressure rule is off here (``reference_max_contention=1``): with it, nothing
    is cached on this box at all (the next test), and the spread rule alone is what this is about."""
    # (the recheck's and the hidden-time check's own verdicts are not what this is about)
    cfg = config(build_cache, recheck_speedup=0.01, recheck_tolerance=100.0, hidden_time_check=False,
                 reference_max_contention=1.0, **BOX)
    problem = fresh_problem("drift")
    with Evaluator(cfg) as ev:  # built before the box is loaded: builds are not what this is about
        for spec in check_candidate(HONEST, cfg.backend, cfg.rules)[0].specs:
            assert not hasattr(ev._build_future(spec).result(), "log"), "the build failed"
    spin = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"  # bounded, and killed below
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    records: list[dict] = []
    verdicts = []
    try:
        with Evaluator(cfg) as ev:
            for i in range(6):
                [v] = ev.evaluate([EvalItem(f"drift-{i}", problem, HONEST)])
                verdicts.append(v)
                record = cached_record(cfg, problem, v.device)
                if record is not None:
                    records.append(record)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    for v in verdicts:
        assert v.status is Status.OK, v.reason
        ref = assert_reference_recorded(v, cfg)
        recheck = v.extra["recheck"]
        first, second = recheck["first"]["reference"], recheck["second"]["reference"]
        assert first and second, recheck  # both reference figures
        if second["how"] != "fresh":  # (fresh: nothing was cached to settle against: every earlier one was noisy)
            assert {"cached_ms", "measured_ms", "decision"} <= set(second["recheck"]), second
        assert ref["value_ms"] == second["value_ms"], (ref, second)  # the speedups divide by the recheck's figure
    assert records, "no reference timing was ever cached: the box was never quiet enough"
    values = [r["value"] for r in records]
    changes = [i for i in range(1, len(records)) if values[i] != values[i - 1]]
    assert len(changes) <= 1, f"the cached reference drifted: {values}"
    for i in changes:
        latest = (records[i].get("disagreements") or [None])[-1]
        assert latest and "replaces" in latest["decision"], (values, latest)  # a recorded, confirmed replacement
        assert latest["cached_ms"] == values[i - 1] and records[i]["how"] == "re-measured", (values, latest)
        assert values[i] in (latest["measured_ms"], latest["third_ms"]), (values, latest)


def test_a_reference_timed_on_oversubscribed_cores_is_not_cached(build_cache):
    """Two spinning processes on a 2-core box (one core for the evaluator): every block of the reference's timing
    waits for a core alike, so the spread may be low while the figure is slow. With the default CPU-pressure rule
    the timing is used for its verdict alone, marked noisy with the contention it saw, and never cached."""
    if cpu_pressure.stall_us() is None:  # a kernel without pressure information: the spread rule alone applies
        return
    cfg = config(build_cache, recheck_speedup=1e9, **BOX)
    problem = fresh_problem("oversubscribed")
    with Evaluator(cfg) as ev:  # built before the box is loaded
        for spec in check_candidate(HONEST, cfg.backend, cfg.rules)[0].specs:
            assert not hasattr(ev._build_future(spec).result(), "log"), "the build failed"
    spin = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    try:
        with Evaluator(cfg) as ev:
            [v] = ev.evaluate([EvalItem("oversubscribed", problem, HONEST)])
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert v.status is Status.OK, v.reason
    ref = assert_reference_recorded(v, cfg)
    assert ref["contention"] > cfg.reference_max_contention and ref["noisy"] and not ref["cached"], ref
    assert ref["attempts"] == 1 + cfg.reference_retries, ref  # measured again while contended
    assert cached_record(cfg, problem, v.device) is None
