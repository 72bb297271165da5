"""The evaluator end to end on the cpu backend: real compiles, a real reference process and sandboxed runners."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from kevin_exp.bench import BenchConfig, CheckRules, Status
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.conftest import fixture_text

RELU = fixture_text("problem_relu.py")


def cand(name: str) -> str:
    return fixture_text("cpu", f"{name}.py")


def item(name: str, reference: str = RELU) -> EvalItem:
    return EvalItem(name, reference, cand(name))


@pytest.fixture(scope="module")
def evaluator(build_cache):
    # these tests are about verdicts other than timing: no recheck of a speedup that the noise of a loaded 2-core
    # box made look large, which can then disagree with itself (rechecks: tests/adversarial/test_recheck.py), and a
    # reference timing cached however noisy or contended the box is (tests/adversarial/test_reference_timing.py)
    config = BenchConfig(backend="cpu", timed_trials=30, warmup_trials=2, cache_dir=build_cache, recheck_speedup=1e9,
                         reference_max_spread=1e9, reference_max_contention=1.0)
    with Evaluator(config) as ev:
        yield ev


def test_correct_kernel_is_ok_with_speedup(evaluator):
    [v] = evaluator.evaluate([item("ok")])
    assert v.status is Status.OK, v.reason
    assert v.correct and v.speedup is not None and v.speedup > 0
    assert v.runtime_ms > 0 and v.ref_runtime_ms > 0
    assert v.runtime_stats.trials == 30 and v.ref_runtime_stats.trials == 30
    assert v.correctness_trials == 5 + 1 and v.atol == pytest.approx(1e-2)  # one more after timing
    assert v.device.startswith("cpu") and v.backend == "cpu"


def test_an_idle_slot_times_the_reference_before_the_first_build_is_done(evaluator):
    """The slot has nothing to run while the problem's first candidate builds: it times the reference then, so the
    run finds the timing cached (on a problem never timed before and a candidate never built before: the comments
    make both sources new, also where KEVIN_EXP_CACHE keeps the build cache across sessions)."""
    token = time.time_ns()
    reference = RELU + f"\n# never timed before: {token}\n"
    # constant expressions that keep the compiler busy for seconds, so the build is surely the slower of the two
    spin = (f"// never built before: {token}\n"
            "template <int K> constexpr long spin() { long s = 0; for (long i = 0; i < 1000; ++i) "
            "for (long j = 0; j < 1000; ++j) s += i ^ j ^ K; return s; }\n"
            + "".join(f"constexpr long v{k} = spin<{k}>();\n" for k in range(6)))
    candidate = cand("ok").replace('source = r"""\n', 'source = r"""\n' + spin, 1)
    assert spin in candidate
    [v] = evaluator.evaluate([EvalItem("slow-build", reference, candidate)])
    assert v.status is Status.OK, v.reason
    assert v.compile_s > 0 and v.extra["ref_timing_cached"]
    assert v.ref_runtime_stats.trials == 30


def test_parameters_initialised_like_the_reference(evaluator):
    [v] = evaluator.evaluate([EvalItem("linear", fixture_text("problem_linear.py"), cand("linear_ok"))])
    assert v.status is Status.OK, v.reason


@pytest.mark.parametrize(
    "name, status, words",
    [
        ("wrong", Status.INCORRECT, "mismatch"),
        ("unwritten_output", Status.INCORRECT, ""),
        ("mutate_inputs", Status.INCORRECT, "modified its input"),
    ],
)
def test_wrong_or_cheating_outputs_are_incorrect(evaluator, name, status, words):
    [v] = evaluator.evaluate([item(name)])
    assert v.status is status, v.reason
    assert words in v.reason
    assert not v.correct and v.speedup is None


def test_a_kernel_caching_by_pointer_is_caught_or_gains_nothing(evaluator):
    """Every call gets freshly allocated inputs with fresh values: where an address repeats, the cached answer is
    stale and the call's check fails; where none repeats, every call computes, so there is nothing to gain."""
    honest, cached = evaluator.evaluate([item("ok"), item("cache_by_pointer")])
    assert honest.status is Status.OK, honest.reason
    if cached.status is Status.OK:
        assert cached.speedup <= 1.5 * honest.speedup, (cached.speedup, honest.speedup)
    else:
        assert cached.status is Status.INCORRECT and not cached.correct, cached.reason


def test_static_rule_hits_are_forbidden_with_rule_name(evaluator):
    [v] = evaluator.evaluate([item("python_tensor_method")])
    assert v.status is Status.FORBIDDEN and v.rule == "torch_compute"
    [v] = evaluator.evaluate([item("aten_compute")])
    assert v.status is Status.FORBIDDEN and v.rule == "native_library_compute"


def test_runtime_block_catches_what_static_rules_let_through(build_cache):
    rules = CheckRules(no_torch_compute=False, no_native_library_compute=False)
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, cache_dir=build_cache, rules=rules,
                         recheck_speedup=1e9)  # not about timing (see the evaluator fixture)
    with Evaluator(config) as ev:
        tensor_method, native = ev.evaluate([item("python_tensor_method"), item("aten_compute")])
    assert tensor_method.status is Status.FORBIDDEN and tensor_method.rule == "runtime_torch_op", tensor_method.reason
    assert native.status is Status.FORBIDDEN and native.rule == "runtime_torch_op", native.reason


def test_crashes_become_verdicts_and_the_batch_goes_on(evaluator):
    verdicts = evaluator.evaluate([item("segfault"), item("ok"), item("exit"), item("huge_alloc"), item("ok")])
    segv, ok1, exited, huge, ok2 = verdicts
    assert segv.status is Status.CRASHED and "SIGSEGV" in segv.reason
    assert exited.status is Status.CRASHED and "code 7" in exited.reason
    assert huge.status in (Status.CRASHED, Status.RUNTIME_ERROR), huge.reason
    assert ok1.status is Status.OK, ok1.reason + ok1.feedback
    assert ok2.status is Status.OK, ok2.reason + ok2.feedback


def test_a_forged_result_counts_for_nothing_and_the_batch_goes_on(evaluator):
    """Native code writes an `ok` result with a 1000x speedup to every descriptor and exits: the verdict is built in
    the parent from the reference process's checks, so a message on the runner's reply pipe decides nothing."""
    forged, ok = evaluator.evaluate([item("forged_result"), item("ok")])
    assert forged.status is Status.FORBIDDEN and forged.rule == "protocol_violation", forged.reason
    assert not forged.correct and forged.speedup is None
    assert ok.status is Status.OK, ok.reason


def test_build_flags_that_run_programs_are_refused_before_any_compile(evaluator):
    marker = Path("/tmp/kx-build-flag-ran")
    marker.unlink(missing_ok=True)
    [v] = evaluator.evaluate([item("build_flag_wrapper")])
    assert v.status is Status.FORBIDDEN and v.rule == "build_flags", v.reason
    assert "'-wrapper'" in v.reason
    assert not marker.exists(), "the candidate's build flag ran a command"


def test_hang_times_out_and_fork_bomb_is_contained(build_cache):
    rules = CheckRules(no_concurrency=False)
    # without the no-new-tasks filter, so the fork bomb runs and the sandbox's own limits must contain it
    # (not about timing either: see the evaluator fixture)
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, hang_floor_s=10, hang_ceiling_s=20, cache_dir=build_cache,
                         rules=rules, forbid_new_tasks=False, recheck_speedup=1e9)
    with Evaluator(config) as ev:
        hang, bomb, ok = ev.evaluate([item("hang"), item("fork_bomb"), item("ok")])
    assert hang.status is Status.TIMEOUT
    assert bomb.status in (Status.TIMEOUT, Status.CRASHED, Status.RUNTIME_ERROR)
    assert ok.status is Status.OK, ok.reason


@pytest.mark.parametrize("sandbox", ["process", "auto"])
def test_nothing_a_candidate_started_outlives_its_verdict(build_cache, sandbox):
    """A child forked by native code is ended with its runner, in both isolation levels (the verdict itself
    does not wait for the runner's exit)."""
    name = f"kxo{os.getpid() % 10000}{sandbox[0]}"
    source = cand("orphan_child").replace("ORPHAN_NAME", name)
    rules = CheckRules(no_concurrency=False)
    # the filter would refuse the fork: this tests the clean-up (and not timing, so no recheck of a noisy speedup)
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, cache_dir=build_cache, rules=rules, sandbox=sandbox,
                         forbid_new_tasks=False, recheck_speedup=1e9)
    with Evaluator(config) as ev:
        [v] = ev.evaluate([EvalItem("orphan", RELU, source)])
        assert v.status is Status.OK, v.reason
        deadline = time.monotonic() + 10
        while processes_named(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not processes_named(name), "the candidate's child process survived its verdict"


def processes_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_flooding_output_is_drained_not_fatal(evaluator):
    [v] = evaluator.evaluate([item("flood_output")])
    assert v.status is Status.OK, v.reason


def test_second_evaluation_hits_the_compile_cache(evaluator):
    evaluator.evaluate([item("ok")])
    second = evaluator.evaluate([item("ok")])
    assert second[0].cache_hit
    assert second[0].compile_s == 0.0


def test_compile_error_has_trimmed_compiler_message(evaluator):
    broken = cand("ok").replace("return out;", "return out")
    [v] = evaluator.evaluate([EvalItem("broken", RELU, broken)])
    assert v.status is Status.COMPILE_ERROR
    assert "error" in v.feedback and len(v.feedback) <= evaluator.config.feedback_chars


def test_format_errors(evaluator):
    no_model = cand("ok").replace("class ModelNew", "class Other")
    syntax = "def broken(:\n"
    a, b = evaluator.evaluate([EvalItem("a", RELU, no_model), EvalItem("b", RELU, syntax)])
    assert a.status in (Status.FORMAT_ERROR, Status.FORBIDDEN)
    assert b.status is Status.FORMAT_ERROR and "parse" in b.reason


def test_verdict_round_trips_through_json(evaluator):
    from kevin_exp.bench.verdict import Verdict

    [v] = evaluator.evaluate([item("ok")])
    assert Verdict.from_json(v.to_json()) == v
    assert dataclasses.asdict(v)["status"] is Status.OK


def test_a_run_slot_keeps_its_standby_workers_starting_and_a_dead_one_is_replaced(build_cache):
    # the slot's runners are what is tested here, not timing: no recheck of a speedup that a 2-core box's noise
    # made look large (it re-times on a fresh runner while the standby ones start, and can then disagree)
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, cache_dir=build_cache, standby_workers=2,
                         recheck_speedup=1e9)
    with Evaluator(config) as ev:
        slot = ev._slots[0]
        [v] = ev.evaluate([item("ok")])
        assert v.status is Status.OK, v.reason
        assert len(slot._standby) == 2 and all(w.alive() for w in slot._standby)
        first = slot._standby[0]
        first.close()  # a standby that died while waiting is skipped, not handed a candidate
        verdicts = ev.evaluate([item("ok"), item("wrong")])
        assert [v.status for v in verdicts] == [Status.OK, Status.INCORRECT]
        assert len(slot._standby) == 2 and first not in slot._standby


def test_closing_one_evaluator_leaves_another_evaluators_workers_alone(evaluator, build_cache):
    """Workers of different evaluators never share a sandbox uid, so one's clean-up cannot kill the other's."""
    [v] = evaluator.evaluate([item("ok")])
    assert v.status is Status.OK, v.reason
    [standby] = evaluator._slots[0]._standby
    assert standby.alive()
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, cache_dir=build_cache)
    with Evaluator(config) as other:
        [w] = other.evaluate([item("segfault")])
        assert w.status is Status.CRASHED
    time.sleep(0.5)
    assert standby.alive(), "closing another evaluator killed this one's warm worker"
    [v] = evaluator.evaluate([item("ok")])
    assert v.status is Status.OK, v.reason


def test_duplicates_in_a_batch_and_a_later_batch_cost_one_compile(evaluator):
    """The same kernel three times in one batch, then again in the next: one build, every verdict ok."""
    unique = cand("ok").replace("auto xc = x.contiguous();", f"auto xc = x.contiguous();  // {time.time_ns()}")
    builds = []
    real_build = evaluator.builder.build

    def counted(spec, *args, **kwargs):
        result = real_build(spec, *args, **kwargs)
        builds.append(result.cached)
        return result

    evaluator.builder.build = counted
    try:
        first = evaluator.evaluate([EvalItem(f"dup{i}", RELU, unique) for i in range(3)])
        [later] = evaluator.evaluate([EvalItem("dup-later", RELU, unique)])
    finally:
        evaluator.builder.build = real_build
    assert [v.status for v in [*first, later]] == [Status.OK] * 4, [v.reason for v in [*first, later]]
    assert builds == [False]  # built once; the duplicates and the later batch shared it
    assert later.cache_hit


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split")
def test_run_cores_keep_the_run_on_its_cores_and_compiles_off_them(build_cache):
    """evaluator.run_cores: the candidate's code runs on the slot's own core, the reference process stays there,
    and compile threads and the fork server (so standby runners) run on the other cores; the verdict records
    the cores."""
    allowed = sorted(os.sched_getaffinity(0))
    own, rest = {allowed[-1]}, set(allowed[:-1])
    rules = CheckRules(restrict_imports=False)  # <sched.h>, for the fixture to report its cores
    config = BenchConfig(backend="cpu", timed_trials=5, warmup_trials=1, cache_dir=build_cache, recheck_speedup=1e9,
                         rules=rules, run_cores=1)
    with Evaluator(config) as ev:
        assert ev.cpu_split.slots == (frozenset(own),) and ev.cpu_split.compiles == frozenset(rest)
        reported, ok = ev.evaluate([item("report_cores"), item("ok")])
        assert reported.status is Status.RUNTIME_ERROR, reported.reason
        assert reported_cores(reported.feedback) == own, reported.feedback
        assert ok.status is Status.OK, ok.reason
        assert ok.extra["run_cores"] == sorted(own)
        assert os.sched_getaffinity(ev._slots[0].reference().proc.pid) == own
        assert os.sched_getaffinity(ev.fork_server.pid) == rest
        assert ev._compile_pool.submit(os.sched_getaffinity, 0).result() == rest
        assert os.sched_getaffinity(0) == set(allowed)  # the caller's thread is left as it was
    with Evaluator(dataclasses.replace(config, run_cores=0)) as ev:
        [reported] = ev.evaluate([item("report_cores")])
        assert reported_cores(reported.feedback) == set(allowed), reported.feedback
        assert reported.extra["run_cores"] == []


def reported_cores(feedback: str) -> set[int]:
    import re

    found = re.search(r"cores:((?: \d+;)+)", feedback)
    assert found, feedback
    return {int(c) for c in re.findall(r"\d+", found.group(1))}


def test_a_run_hands_the_gil_over_promptly_and_puts_the_interval_back(evaluator):
    """While a run is in progress the interpreter's switch interval is 0.2 ms (a busy Python thread beside the
    run, such as the policy generating, would otherwise hold each of the run's replies up to 5 ms); before and
    after, it is what it was."""
    import sys
    import threading

    from kevin_exp.bench.gil_handoff import RUN_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(sys.getswitchinterval())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        [v] = evaluator.evaluate([item("ok")])
    finally:
        done.set()
        watcher.join()
    assert v.status is Status.OK, v.reason
    assert before > RUN_SWITCH_INTERVAL_S and min(seen) == pytest.approx(RUN_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == before


def test_the_load_reports_where_its_time_went(evaluator):
    """The verdict's phases split the candidate's load into its parts; a module that works at import (here a
    Python loop, hundreds of milliseconds) shows as ``load_module_s``, not as the harness's own parts, which include
    the collection before the first call (it walks only what the load made: the harness's objects are frozen)."""
    from kevin_exp.bench.protocol import LOAD_PHASES

    busy = cand("ok").replace("import torch\n", "import torch\n\n_warm = sum(i * i for i in range(3_000_000))\n", 1)
    assert "_warm" in busy
    [v] = evaluator.evaluate([EvalItem("busy-import", RELU, busy)])
    assert v.status is Status.OK, v.reason
    phases = v.extra["phases"]
    parts = {k: phases[f"load_{k}_s"] for k in LOAD_PHASES}
    assert sum(parts.values()) <= phases["load_s"] + 0.01
    assert max(parts, key=parts.get) == "module", parts
