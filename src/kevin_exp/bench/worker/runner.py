"""The candidate's runner: load the candidate, construct ``ModelNew``, then serve trials in lockstep with the
parent. Every call has three phases, each a request and a reply: ``trial`` (the inputs, fresh every call, are
copied from the shared region to the device, the allocator poisoned and, before a timed call, the cache
flushed; reply ``ready``), ``go`` (forward under the op guard, its output made dense inside it; a timed call
between the timer's start and its end after a device-wide synchronise; then, after the timer and before the
reply, the output checked for its kind, the whole output and the inputs as the call left them copied to the
region, everything the call made dropped and the device synchronised; reply ``ran`` with the time) and
``collect`` (reply ``done`` with where the copies are). The parent's own clock brackets ``go``, so it covers
every byte of the output as checked. Calibration calls, made before any candidate code is loaded, take the
same three phases with a stand-in. The runner judges nothing: the trusted reference process checks every
call's outputs and inputs in the region, and the parent builds the verdict.

Requests and replies are JSON lines (``entry`` describes the process).
"""
from __future__ import annotations

import gc
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import IO, Any, Callable

import torch

from kevin_exp.bench.exchange import DeviceBytes, HeaderError, Layout, Region, read_values, validate, write_values
from kevin_exp.bench.worker.candidate import ExtensionCalls, hook_load_inline, load_candidate
from kevin_exp.bench.worker.final_output import final_output, held_inputs, inputs_kept, not_aliased
from kevin_exp.bench.worker.framework_flags import FlagSnapshot
from kevin_exp.bench.worker.memory_fill import input_reader, poison_allocator, zeros_like
from kevin_exp.bench.worker.outcomes import NeedsBuild, Rejected, stage
from kevin_exp.bench.worker.tensors import clone_values, device_name, synchronize
from kevin_exp.bench.worker.timing import CacheFlusher, Timer


def warm_harness(exchange_fd: int, backend: str, fd_socket: int = -1) -> "Harness":
    """The harness, made before the runner says it is ready: the cache flusher's buffer, the timer, and the
    exchange region mapped (and page-locked on cuda) at its current size, which a run would otherwise pay on its
    first collect (the region grows only when a larger problem comes; it is then mapped again)."""
    harness = Harness(Region(exchange_fd, pin=backend == "cuda"), backend)
    harness.fd_socket = fd_socket
    size = os.fstat(exchange_fd).st_size if exchange_fd >= 0 else 0
    if size:
        harness.region.mapped(size)
    return harness


def serve(requests: IO[bytes], replies: IO[str], harness: "Harness") -> None:
    def reply(message: dict[str, Any]) -> None:
        if message.get("op") in ("ready", "done"):  # how long the phase took here (the parent sums it, as a diagnostic)
            message["busy_ms"] = round((time.perf_counter() - started) * 1e3, 3)
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    runner: Runner | None = None
    for line in requests:
        started = time.perf_counter()
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "problem" and runner is None and harness.pending is None and harness.problem is None:
                harness.set_problem(request)
                reply({"op": "problem_ready"})
            elif op == "device_region" and runner is None and harness.pending is None and harness.device_bytes is None:
                reply(harness.attach_device_region(request))
            elif op == "calibrate" and runner is None and harness.pending is None:
                reply(harness.stage(request, harness.stand_in(request)))
            elif op == "load" and runner is None and harness.pending is None:
                harness.close_fd_socket()
                runner = Runner(request, harness)
                reply({"op": "loaded", "device": device_name(runner.device), "load_s": runner.load_s,
                       "load_phases": runner.load_phases})
            elif op == "trial" and runner is not None and harness.pending is None:
                reply(harness.stage(request, runner.call(request)))
            elif op == "go" and harness.pending is not None and harness.pending.ms is _NOT_RUN:
                reply(harness.go())
            elif op == "collect" and harness.pending is not None and harness.pending.ms is not _NOT_RUN:
                reply(harness.collect())
            elif op == "end" and runner is not None and harness.pending is None:
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


_NOT_RUN = object()


@dataclass
class Call:
    """One call in its three phases: staged (inputs on the device, cache flushed), run (``go``: the only part the
    parent's clock brackets; outputs and post-call inputs written to the region there), collected (where they are
    said)."""

    i: int
    inputs: list[Any] | None
    timed: bool
    run: Callable[[], Any] | None  # the call itself, under the op guard (or the calibration stand-in)
    after_run: Callable[[Any], None] = lambda out: None  # checks on a finished call, made inside "go"
    ms: Any = _NOT_RUN
    held: list[tuple[Any, ...]] | None = None  # the inputs' tensors as staged: data, storage, layout
    written: dict[str, Any] | None = None  # the headers of the outputs and post-call inputs in the region
    expected: dict[str, Any] | None = None  # the header of the output the call must return


class Harness:
    """What the runner has before any candidate code: the region, the device, the timer and the cache flusher,
    and the three phases every call goes through. Calibration calls (``stand_in``, before any candidate code
    is loaded) take exactly the same phases with a stand-in that only fills an output of the expected shape,
    so the parent learns what the ``go`` phase costs beyond the reported time."""

    def __init__(self, region: Region, backend: str) -> None:
        self.region = region
        self.device = torch.device("cuda" if backend == "cuda" else "cpu")
        self.flusher = CacheFlusher(self.device)
        self.timer = Timer(self.device)
        self.pending: Call | None = None
        self.layout: Layout | None = None
        self.expected_output: dict[str, Any] | None = None  # the output's header, for poisoning the allocator
        self.problem: dict[str, Any] | None = None  # the reference program, for drawing seeded inputs
        self.fd_socket = -1  # where the parent sends the device region's descriptor (cuda)
        self.device_bytes: DeviceBytes | None = None  # the outputs part in device memory, once attached
        self.device_region: Any = None
        # the calibration's calls all draw from one seed: its inputs and their fingerprint, drawn once and copied
        self.calibration_inputs: tuple[int, list[Any], list[Any]] | None = None

    def close_fd_socket(self) -> None:
        if self.fd_socket >= 0:
            os.close(self.fd_socket)
            self.fd_socket = -1

    def attach_device_region(self, request: dict[str, Any]) -> dict[str, Any]:
        """Before any candidate code: map the device allocation the reference process made for this run's outputs
        (its descriptor comes on ``fd_socket``); outputs and post-call inputs are then copied there, device to
        device. Where that fails, the run keeps the host region and the reply says why."""
        import socket

        from kevin_exp.bench.device_exchange import DeviceExchangeError, DeviceRegion

        try:  # the socket is closed once used: candidate code gets no channel to the parent from it
            with socket.socket(fileno=self.fd_socket) as sock:
                self.fd_socket = -1
                _, fds, _, _ = socket.recv_fds(sock, 16, 1)
        except OSError as exc:
            return {"op": "device_region", "where": "host", "why": f"no descriptor ({exc})"}
        if len(fds) != 1:
            return {"op": "device_region", "where": "host", "why": "no descriptor"}
        try:
            self.device_region = DeviceRegion.import_fd(fds[0], int(request["bytes"]), self.device)
        except (DeviceExchangeError, ValueError, KeyError, TypeError) as exc:
            return {"op": "device_region", "where": "host", "why": str(exc)[:500]}
        finally:
            os.close(fds[0])
        self.device_bytes = DeviceBytes(self.device_region.bytes, int(request["base"]))
        return {"op": "device_region", "where": "device"}

    def set_problem(self, request: dict[str, Any]) -> None:
        """The reference program (trusted, the problem's own code), loaded before any candidate code: with it
        the runner draws each call's inputs from the seed it is sent for that call."""
        from kevin_exp.bench.worker.reference import load_reference

        try:
            self.problem = load_reference(str(request["source"]), str(request["backend"]))
        except Exception as exc:  # noqa: BLE001 - the reference process loaded the same program
            raise Rejected("crashed", f"evaluator error: the runner could not load the reference program ({exc})") from None

    def inputs_for(self, request: dict[str, Any]) -> tuple[Any, list[Any] | None]:
        """A call's inputs: drawn from the call's seed (and their fingerprint) or read from the region."""
        assert self.layout is not None
        if "seed" in request:
            from kevin_exp.bench.sampling import fingerprint
            from kevin_exp.bench.worker.reference import make_inputs

            if self.problem is None or not _is_seed(request["seed"]):
                raise Rejected("crashed", "evaluator error: bad request (a seed without a problem)")
            seed = int(request["seed"])
            if request.get("op") == "calibrate":  # no candidate code is loaded yet: a copy is as good as a draw
                if self.calibration_inputs is None or self.calibration_inputs[0] != seed:
                    drawn = make_inputs(self.problem, seed, self.device)
                    self.calibration_inputs = (seed, drawn, fingerprint(list(drawn)))
                _, drawn, prints = self.calibration_inputs
                return clone_values(drawn), prints
            inputs = make_inputs(self.problem, seed, self.device)
            return inputs, fingerprint(list(inputs))
        return self.read(request["inputs"], self.layout.inputs_at, self.layout.outputs_at), None

    def read(self, header: Any, start: int, end: int) -> Any:
        try:
            validate(header, start, end)
            return read_values(header, self.region.mapped(end), self.device)
        except HeaderError as exc:
            raise Rejected("crashed", f"evaluator error: bad request ({exc})") from exc

    def stand_in(self, request: dict[str, Any]) -> Callable[[list[Any]], Call]:
        self.layout = Layout.from_json(request["layout"])
        expected = request["output"]
        guarded = bool(request.get("guard", True))

        def make(inputs: list[Any]) -> Call:
            guard = _guard(guarded)  # made while staging, as for the candidate's calls
            warm = input_reader(inputs, self.device)

            def run() -> tuple[float | None, Any]:
                with torch.no_grad(), guard:
                    return self.timer(lambda: warm() or _dense(zeros_like(expected, self.device, serial=True)))
            return Call(request["i"], inputs, True, run)
        self.expected_output = expected  # poisoned for as the candidate's calls will be
        return make

    def stage(self, request: dict[str, Any], make: Callable[[list[Any]], Call]) -> dict[str, Any]:
        """Phase 1: the call's inputs copied in (host -> device on cuda), the allocator poisoned (before every
        call: nothing about a call may tell the kernel whether it is checked), the cache flushed before timed
        calls, the device idle; then "ready"."""
        inputs, drawn = self.inputs_for(request)
        if not isinstance(inputs, list):
            raise Rejected("crashed", "evaluator error: inputs must be a list")
        call = make(inputs)
        call.held = held_inputs(inputs)
        # a call at a hidden size expects an output of its own shape (the parent says so); others the problem's
        call.expected = request.get("output") or self.expected_output
        if call.expected is not None:
            poison_allocator(call.expected, self.device)
        synchronize(self.device)
        if call.timed:
            self.flusher.flush()
            synchronize(self.device)
        self.pending = call
        ready: dict[str, Any] = {"op": "ready", "i": call.i}
        if drawn is not None:
            ready["fingerprint"] = drawn
        return ready

    def go(self) -> dict[str, Any]:
        """Phase 2, the one the parent's clock brackets: the call (timed calls: the timer runs and the device is
        synchronised device-wide inside it), then, after the timer, the output final (``finish``), then the
        reported time."""
        call = self.pending
        assert call is not None and call.run is not None
        call.ms, out = call.run()
        self.finish(call, out)
        del out  # the last reference to what the call returned: a deleter runs now, inside the clock
        synchronize(self.device)  # device-wide: work a deleter launched ends before "ran" too
        return {"op": "ran", "i": call.i, "ms": call.ms}

    def finish(self, call: Call, out: Any) -> None:
        """Inside the parent's clock, after the runner's own timer: the output must be of the expected kind, dense,
        and in memory of its own (no input's); every byte of it, and the inputs as the call left them, are copied
        to the region (on cuda: device -> page-locked host); the call's inputs and closures are dropped (``go``
        drops the output and synchronises the device). So once "ran" is sent, what the reference process will read
        exists, and nothing of the call is left to run."""
        layout = self.layout
        assert layout is not None and call.inputs is not None and call.held is not None
        if gc.isenabled():  # a collection would run candidates' finalisers whenever the harness allocates
            gc.disable()
        call.after_run(out)
        if call.expected is not None:
            final_output(out, call.expected, self.device)
        inputs_kept(call.inputs, call.held)
        not_aliased(out, call.held)
        mm = self.device_bytes if self.device_bytes is not None else self.region.mapped(layout.size)
        try:
            outputs, _ = write_values(out, mm, layout.outputs_at, layout.after_at, serial=True)
        except HeaderError as exc:
            raise Rejected("incorrect", f"trial {call.i}: output {exc}") from None
        except Exception as exc:  # noqa: BLE001 - reading the output back is the candidate's output too
            raise Rejected("runtime_error", f"reading your output back raised: {type(exc).__name__}: {exc}") from None
        after, _ = write_values(call.inputs, mm, layout.after_at, layout.size, serial=True)
        call.written = {"outputs": outputs, "after": after}
        call.inputs = call.run = None
        call.after_run = _nothing

    def collect(self) -> dict[str, Any]:
        """Phase 3: where the finished call's output and post-call inputs are in the region (written in "go")."""
        call = self.pending
        assert call is not None and call.written is not None
        self.pending = None
        return {"op": "done", "i": call.i, **call.written}


def _is_seed(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 63)


def _nothing(out: Any) -> None:
    return None


def _dense(out: Any) -> Any:
    """The output with every plain tensor made dense and contiguous, inside the call (and inside the timer): a
    strided or transposed view's copy is the call's own work, never the harness's after the clock. Anything but
    a plain tensor, list or tuple is left for ``final_output`` to refuse (a subclass's methods are its own code)."""
    if type(out) is torch.Tensor:
        return out if out.layout != torch.strided or out.is_contiguous() else out.contiguous()
    if type(out) in (list, tuple):
        items = [_dense(v) for v in out]
        return items if type(out) is list else tuple(items)
    return out


def _guard(on: bool) -> Any:
    from kevin_exp.bench.runtime_guard import block_torch_compute

    return block_torch_compute() if on else _NullGuard()


class Runner:
    def __init__(self, job: dict[str, Any], harness: Harness) -> None:
        from kevin_exp.bench.runtime_guard import snapshot_timing_functions

        t0 = time.perf_counter()
        # where the load's time goes (a diagnostic the verdict's phases carry: nothing is decided on it)
        self.load_phases: dict[str, float] = {}
        clock = [t0]

        def lap(name: str) -> None:
            now = time.perf_counter()
            self.load_phases[name] = round(now - clock[0], 4)
            clock[0] = now

        self.harness = harness
        self.device = harness.device
        self.rules = job["rules"]
        self.layout = Layout.from_json(job["layout"])
        harness.layout = self.layout
        harness.calibration_inputs = None
        harness.expected_output = job["output"]
        # TF32 off: fp32 problems are compared against true fp32 (hack 11).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if harness.device_bytes is not None and harness.problem is not None:
            # outputs go to the device region and every call's inputs are drawn from its seed: the host region
            # carries only the init inputs and the hidden checks' inputs, too little to repay page-locking it
            # (about a second per GiB, paid before every load)
            harness.region.pin = False
        init_inputs = harness.read(job["init"], self.layout.inputs_at, self.layout.outputs_at)
        from kevin_exp.bench.seccomp import close_exchange_descriptor

        close_exchange_descriptor(harness.region, self.layout.size)  # no writable file left to map executable
        lap("region")
        # everything the harness made so far (torch, the reference, the calibration) is left out of every later
        # collection: the one below then walks only what the candidate's load made (tenths of a second less)
        gc.freeze()
        self.timing_snapshot = snapshot_timing_functions()
        self.flags = FlagSnapshot() if self.rules.get("framework_flags") else None
        self.calls = ExtensionCalls()
        hook_load_inline({k: tuple(v) for k, v in job.get("prebuilt", {}).items()}, self.calls)
        lap("snapshots")
        with stage("runtime_error", "loading your module raised"):
            namespace = load_candidate(job["candidate"])
        lap("module")
        if "ModelNew" not in namespace:
            raise Rejected("format_error", "the code defines no class ModelNew")
        self.check_timing_untouched()
        with stage("runtime_error", "constructing ModelNew raised"):
            torch.manual_seed(int(job["seed"]))  # the seed the reference's Model was built with, as KernelBench does
            self.model = namespace["ModelNew"](*init_inputs).to(self.device)
        lap("construct")
        # made before any candidate code ran
        self.timer = harness.timer
        # from here on no collection runs between the calls: it would run candidates' finalisers (a tensor's
        # deleter in a reference cycle) wherever the harness happens to allocate, after the clock
        gc.collect()
        gc.disable()
        lap("collect")
        self.load_s = round(time.perf_counter() - t0, 4)

    def call(self, request: dict[str, Any]) -> Callable[[list[Any]], Call]:
        """How one trial's call runs (``Harness.go``) and what is checked once it has run (``Harness.collect``)."""
        from kevin_exp.bench.runtime_guard import ForbiddenOpError

        timed = bool(request.get("timed"))

        def make(inputs: list[Any]) -> Call:
            guard = _guard(self.rules["runtime_block_torch_ops"])
            calls_before = [0]

            def run() -> tuple[float | None, Any]:
                calls_before[0] = self.calls.count
                try:
                    with stage("runtime_error", "your forward raised"):
                        with torch.no_grad():
                            if timed:
                                with guard:
                                    return self.timer(lambda: _dense(self.model(*inputs)))
                            with guard:
                                out = _dense(self.model(*inputs))
                            synchronize(self.device)
                            return None, out
                except Rejected as rej:
                    blocked = getattr(guard, "violations", None)
                    if blocked or isinstance(rej.__cause__, ForbiddenOpError):
                        op = blocked[0] if blocked else rej.__cause__.op
                        raise Rejected("forbidden", f"forward called the PyTorch op {op}; compute must happen in your kernel",
                                       rule="runtime_torch_op") from None
                    raise

            def after_run(out: Any) -> None:
                self.check_flags_untouched()
                if getattr(guard, "violations", None):
                    raise Rejected("forbidden", f"forward called the PyTorch op {guard.violations[0]}; compute must happen in "
                                   "your kernel", rule="runtime_torch_op")
                if self.rules["runtime_require_kernel_call"] and self.calls.count == calls_before[0]:
                    raise Rejected("forbidden", "forward never called a function of the extension built with load_inline",
                                   rule="kernel_not_called")
                for t in out if isinstance(out, (list, tuple)) else [out]:
                    if isinstance(t, torch.Tensor) and t.device.type != self.device.type:
                        raise Rejected("incorrect", f"output must be on {self.device.type}, got a tensor on {t.device}")

            return Call(request["i"], inputs, timed, run, after_run)
        return make

    def finish(self) -> None:
        self.check_timing_untouched()
        self.check_flags_untouched()

    def check_flags_untouched(self) -> None:
        changed = self.flags.changed() if self.flags is not None else []
        if changed:
            raise Rejected("forbidden", f"framework flags that change numerics or kernels were changed: {'; '.join(changed)}",
                           rule="framework_flags")

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
