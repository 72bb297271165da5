"""The worker's evaluation loop for its one job: load the reference and the candidate, build both models,
correctness trials, interleaved timing, correctness again; the result (or why the candidate was rejected)
as a dict for the signed result channel.

Order of one correctness trial (docs/hack_defences.md): fresh seeded inputs -> separate clones for
reference and candidate -> reference runs first and its output stays alive -> freed allocator memory is
poisoned with NaN -> candidate runs under the torch-op block -> output type/shape/dtype/finite/allclose ->
candidate's inputs must be unchanged. Every step may meet hostile code; any exception becomes a verdict.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Callable

import torch

from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.job import config_from_job
from kevin_exp.bench.verdict import TimingStats
from kevin_exp.bench.worker.candidate import (
    ExtensionCalls,
    hook_load_inline,
    load_candidate,
)
from kevin_exp.bench.worker.comparison import (
    compare_outputs,
    poison_allocator,
    same_values,
)
from kevin_exp.bench.worker.outcomes import NeedsBuild, Rejected, stage
from kevin_exp.bench.worker.reference import load_reference, make_inputs
from kevin_exp.bench.worker.tensors import clone_values, synchronize
from kevin_exp.bench.worker.timing import interleaved_timing


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    try:
        return _evaluate(job)
    except NeedsBuild as need:
        return {"needs_build": asdict(need.spec)}
    except Rejected as rej:
        return {"status": rej.status, "reason": rej.reason, "rule": rej.rule, "detail": rej.detail}


def _evaluate(job: dict[str, Any]) -> dict[str, Any]:
    from kevin_exp.bench.runtime_guard import (
        ForbiddenOpError,
        block_torch_compute,
        snapshot_timing_functions,
        verify_timing_functions,
    )

    config = config_from_job(job)
    rules = config.rules
    device = torch.device("cuda" if config.backend == "cuda" else "cpu")
    phases: dict[str, float] = {}
    result: dict[str, Any] = {"device": _device_name(device), "phases": phases}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name] = round(now - clock[0], 4)
        clock[0] = now

    # TF32 off: fp32 problems are compared against true fp32 (hack 11).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    with stage("runtime_error", "the reference program failed"):
        ref_ns = load_reference(job["reference"], config.backend)
    timing_snapshot = snapshot_timing_functions()
    calls = ExtensionCalls()
    hook_load_inline({k: tuple(v) for k, v in job.get("prebuilt", {}).items()}, calls)
    with stage("runtime_error", "loading your module raised"):
        cand_ns = load_candidate(job["candidate"])
    if "ModelNew" not in cand_ns:
        raise Rejected("format_error", "the code defines no class ModelNew")
    _check_timing_untouched(rules, timing_snapshot, verify_timing_functions)
    lap("load_s")

    with stage("runtime_error", "the reference program failed"):
        torch.manual_seed(config.seed)
        init_inputs = ref_ns["get_init_inputs"]()
        torch.manual_seed(config.seed)
        ref_model = ref_ns["Model"](*init_inputs).to(device).eval()
    with stage("runtime_error", "constructing ModelNew raised"):
        torch.manual_seed(config.seed)  # same seed before both constructors, as KernelBench does
        new_model = cand_ns["ModelNew"](*init_inputs).to(device)

    def correctness(seed_offset: int) -> float:
        worst = 0.0
        for trial in range(config.correctness_trials):
            seed = config.seed + seed_offset + 7919 * trial
            inputs = make_inputs(ref_ns, seed, device)
            pristine = clone_values(inputs)
            with torch.no_grad():
                with stage("runtime_error", "the reference program failed"):
                    ref_out = ref_model(*clone_values(inputs))
                    synchronize(device)
                poison_allocator(ref_out, device)
                cand_inputs = clone_values(inputs)
                guard = block_torch_compute() if rules.runtime_block_torch_ops else _NullGuard()
                calls_before = calls.count
                try:
                    with stage("runtime_error", "your forward raised"):
                        with guard:
                            out = new_model(*cand_inputs)
                        synchronize(device)
                except Rejected as rej:
                    blocked = getattr(guard, "violations", None)
                    if blocked or isinstance(rej.__cause__, ForbiddenOpError):
                        op = blocked[0] if blocked else rej.__cause__.op
                        raise Rejected("forbidden", f"forward called the PyTorch op {op}; compute must happen in your kernel",
                                       rule="runtime_torch_op") from None
                    raise
                if getattr(guard, "violations", None):
                    raise Rejected("forbidden", f"forward called the PyTorch op {guard.violations[0]}; compute must happen in "
                                   "your kernel", rule="runtime_torch_op")
            if rules.runtime_require_kernel_call and calls.count == calls_before:
                raise Rejected("forbidden", "forward never called a function of the extension built with load_inline",
                               rule="kernel_not_called")
            cmp = compare_outputs(ref_out, out, config)
            if not cmp.ok:
                raise Rejected("incorrect", f"trial {trial + 1}/{config.correctness_trials}: {cmp.reason}")
            if not same_values(cand_inputs, pristine):
                raise Rejected("incorrect", f"trial {trial + 1}: forward modified its input tensors in place")
            worst = max(worst, cmp.max_abs_diff)
            del out, ref_out, cand_inputs, pristine, inputs
        return worst

    lap("construct_s")
    max_diff = correctness(0)
    lap("correctness_s")
    tol = config.tolerance_for("float32")
    result.update(correctness_trials=config.correctness_trials, max_abs_diff=max_diff, atol=tol.atol, rtol=tol.rtol)

    input_sets = [make_inputs(ref_ns, config.seed + 104729 * (k + 1), device) for k in range(max(1, config.timing_input_sets))]
    with torch.no_grad():
        ref_outputs = [ref_model(*clone_values(s)) for s in input_sets]
    with stage("runtime_error", "your forward raised during timing"):
        lap("timing_inputs_s")
        timing = interleaved_timing(ref_model, new_model, input_sets, ref_outputs, device, config)
    lap("timing_s")
    _check_timing_untouched(rules, timing_snapshot, verify_timing_functions)
    # Again after timing, on new inputs: state carried across calls must not change the answer.
    correctness(1_000_003)
    _check_timing_untouched(rules, timing_snapshot, verify_timing_functions)
    lap("recheck_s")

    new_stats = TimingStats.from_samples(timing.new_ms)
    ref_stats = TimingStats.from_samples(timing.ref_ms)
    result.update(
        status="ok",
        runtime_stats=asdict(new_stats),
        ref_runtime_stats=asdict(ref_stats),
    )
    return result


class _NullGuard:
    violations: list[str] = []

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def _check_timing_untouched(rules: CheckRules, snapshot: dict[str, object],
                            verify: Callable[[dict[str, object]], list[str]]) -> None:
    if not rules.no_timing_patch:
        return
    changed = verify(snapshot)
    if changed:
        raise Rejected("forbidden", f"timing/synchronisation functions were replaced: {', '.join(changed)}", rule="timing_tampered")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "cpu: " + (platform.processor() or platform.machine())
