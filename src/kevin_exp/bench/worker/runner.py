"""The candidate's runner: load the candidate, construct ``ModelNew``, then serve trials in lockstep with the
parent. Each trial's inputs arrive in the shared region (fresh every call); the runner copies them to the
device, runs forward under the op guard (a timed trial: cache flush, CUDA events, device-wide sync), and
writes the outputs and its inputs as they were after the call back to the region. It judges nothing: the
trusted reference process checks every call's outputs and inputs, and the parent builds the verdict.

Requests and replies are JSON lines (``entry`` describes the process).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import IO, Any

import torch

from kevin_exp.bench.exchange import HeaderError, Layout, Region, read_values, validate, write_values
from kevin_exp.bench.worker.candidate import ExtensionCalls, hook_load_inline, load_candidate
from kevin_exp.bench.worker.outcomes import NeedsBuild, Rejected, stage
from kevin_exp.bench.worker.tensors import device_name, synchronize
from kevin_exp.bench.worker.timing import CacheFlusher, Timer


def serve(requests: IO[bytes], replies: IO[str], exchange_fd: int, backend: str) -> None:
    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    harness = Harness(Region(exchange_fd, pin=backend == "cuda"), backend)
    runner: Runner | None = None
    for line in requests:
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "calibrate" and runner is None:
                reply(harness.calibrate(request))
            elif op == "load" and runner is None:
                runner = Runner(request, harness)
                reply({"op": "loaded", "device": device_name(runner.device), "load_s": runner.load_s})
            elif op == "trial" and runner is not None:
                reply(runner.trial(request))
            elif op == "end" and runner is not None:
                runner.finish()
                reply({"op": "ended"})
                return
            else:
                reply({"op": "worker_error", "reason": f"unexpected request {op!r}"})
                return
        except NeedsBuild as need:
            reply({"op": "needs_build", "spec": asdict(need.spec)})
            return
        except Rejected as rej:
            reply({"op": "rejected", "status": rej.status, "reason": rej.reason, "rule": rej.rule, "detail": rej.detail})
            return


class Harness:
    """What the runner has before any candidate code: the region, the device, the timer and the cache flusher.
    ``calibrate`` runs a call's whole path (inputs in, flush, a timed stand-in that only fills an output of
    the expected shape, outputs out) so the parent learns what a call costs beyond its reported time."""

    def __init__(self, region: Region, backend: str) -> None:
        self.region = region
        self.device = torch.device("cuda" if backend == "cuda" else "cpu")
        self.flusher = CacheFlusher(self.device)
        self.timer = Timer(self.device)

    def read(self, header: Any, start: int, end: int) -> Any:
        try:
            validate(header, start, end)
            return read_values(header, self.region.mapped(end), self.device)
        except HeaderError as exc:
            raise Rejected("crashed", f"evaluator error: bad request ({exc})") from exc

    def calibrate(self, request: dict[str, Any]) -> dict[str, Any]:
        layout = Layout.from_json(request["layout"])
        inputs = self.read(request["inputs"], layout.inputs_at, layout.outputs_at)
        expected = request["output"]
        synchronize(self.device)
        self.flusher.flush()
        ms, out = self.timer(lambda: _zeros_like(expected, self.device))
        write_values(out, self.region.mapped(layout.size), layout.outputs_at, layout.after_at)
        del inputs
        return {"op": "calibrated", "i": request["i"], "ms": ms}


def _zeros_like(header: dict[str, Any], device: torch.device) -> Any:
    t = header["t"]
    if t == "tensor":
        return torch.zeros(header["shape"], dtype=getattr(torch, header["dtype"]), device=device)
    if t in ("list", "tuple"):
        items = [_zeros_like(h, device) for h in header["items"]]
        return items if t == "list" else tuple(items)
    return header.get("value")


class Runner:
    def __init__(self, job: dict[str, Any], harness: Harness) -> None:
        from kevin_exp.bench.runtime_guard import snapshot_timing_functions

        t0 = time.perf_counter()
        self.harness = harness
        self.device = harness.device
        self.rules = job["rules"]
        self.layout = Layout.from_json(job["layout"])
        self.region = harness.region
        self.expected_output = job["output"]
        # TF32 off: fp32 problems are compared against true fp32 (hack 11).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        init_inputs = harness.read(job["init"], self.layout.inputs_at, self.layout.outputs_at)
        self.timing_snapshot = snapshot_timing_functions()
        self.calls = ExtensionCalls()
        hook_load_inline({k: tuple(v) for k, v in job.get("prebuilt", {}).items()}, self.calls)
        with stage("runtime_error", "loading your module raised"):
            namespace = load_candidate(job["candidate"])
        if "ModelNew" not in namespace:
            raise Rejected("format_error", "the code defines no class ModelNew")
        self.check_timing_untouched()
        with stage("runtime_error", "constructing ModelNew raised"):
            torch.manual_seed(int(job["seed"]))  # the seed the reference's Model was built with, as KernelBench does
            self.model = namespace["ModelNew"](*init_inputs).to(self.device)
        # made before any candidate code ran
        self.flusher = harness.flusher
        self.timer = harness.timer
        self.load_s = round(time.perf_counter() - t0, 4)

    def _read(self, header: Any, start: int, end: int) -> Any:
        return self.harness.read(header, start, end)

    def trial(self, request: dict[str, Any]) -> dict[str, Any]:
        from kevin_exp.bench.runtime_guard import ForbiddenOpError, block_torch_compute

        layout = self.layout
        inputs = self._read(request["inputs"], layout.inputs_at, layout.outputs_at)
        if not isinstance(inputs, list):
            raise Rejected("crashed", "evaluator error: inputs must be a list")
        if request.get("poison"):
            poison_allocator(self.expected_output, self.device)
        synchronize(self.device)
        guard = block_torch_compute() if self.rules["runtime_block_torch_ops"] else _NullGuard()
        calls_before = self.calls.count
        ms = None
        try:
            with stage("runtime_error", "your forward raised"):
                with torch.no_grad():
                    if request.get("timed"):
                        self.flusher.flush()
                        with guard:
                            ms, out = self.timer(lambda: self.model(*inputs))
                    else:
                        with guard:
                            out = self.model(*inputs)
                        synchronize(self.device)
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
        if self.rules["runtime_require_kernel_call"] and self.calls.count == calls_before:
            raise Rejected("forbidden", "forward never called a function of the extension built with load_inline",
                           rule="kernel_not_called")
        for t in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(t, torch.Tensor) and t.device.type != self.device.type:
                raise Rejected("incorrect", f"output must be on {self.device.type}, got a tensor on {t.device}")
        mm = self.region.mapped(layout.size)
        try:
            outputs, _ = write_values(out, mm, layout.outputs_at, layout.after_at)
        except HeaderError as exc:
            raise Rejected("incorrect", f"trial {request['i']}: output {exc}") from None
        except Exception as exc:  # noqa: BLE001 - reading the output back is the candidate's output too
            raise Rejected("runtime_error", f"reading your output back raised: {type(exc).__name__}: {exc}") from None
        after: dict[str, Any] = {"t": "list", "items": []}
        if request.get("return_inputs"):
            after, _ = write_values(inputs, mm, layout.after_at, layout.size)
        return {"op": "done", "i": request["i"], "ms": ms, "outputs": outputs, "after": after}

    def finish(self) -> None:
        self.check_timing_untouched()

    def check_timing_untouched(self) -> None:
        from kevin_exp.bench.runtime_guard import verify_timing_functions

        if not self.rules["no_timing_patch"]:
            return
        changed = verify_timing_functions(self.timing_snapshot)
        if changed:
            raise Rejected("forbidden", f"timing/synchronisation functions were replaced: {', '.join(changed)}",
                           rule="timing_tampered")


class _NullGuard:
    violations: list[str] = []

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def poison_allocator(expected: dict[str, Any], device: torch.device, copies: int = 3) -> None:
    """Leave NaN in freed allocator blocks of the output's size, so an output the kernel never writes shows."""
    headers = expected["items"] if expected.get("t") in ("list", "tuple") else [expected]
    held = []
    for h in headers:
        if h.get("t") != "tensor":
            continue
        dtype = getattr(torch, h["dtype"])
        fill: float | int = float("nan") if dtype.is_floating_point else (1 if dtype in (torch.bool, torch.uint8, torch.int8) else -1234567)
        for _ in range(copies):
            held.append(torch.full(h["shape"], fill, dtype=dtype, device=device))
    synchronize(device)
    del held
