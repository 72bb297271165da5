"""What runs inside one sandboxed worker: load reference and candidate, check correctness, time both.

Every function here may meet hostile code; the worker turns any exception into a verdict. Order of
one correctness trial (kevin-recipe.md 1.6, 2.3 and 5):
  fresh seeded inputs -> separate clones for reference and candidate -> reference runs first and its
  output stays alive -> freed allocator memory is poisoned with NaN -> candidate runs under the
  torch-op block -> output type/shape/dtype/finite/allclose -> candidate's inputs must be unchanged.
"""
from __future__ import annotations

import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.spec import ExtensionSpec


class Rejected(Exception):
    """A candidate outcome that is a verdict, not an evaluator error."""

    def __init__(self, status: str, reason: str, rule: str | None = None, detail: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rule = rule
        self.detail = detail


class NeedsBuild(Exception):
    """The candidate called load_inline with a spec the parent has not built yet."""

    def __init__(self, spec: ExtensionSpec) -> None:
        super().__init__(spec.name)
        self.spec = spec


# --------------------------------------------------------------------------- loading


def exec_module(source: str, filename: str, extra_globals: dict[str, Any] | None = None) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": filename.removesuffix(".py"), "__file__": filename}
    if extra_globals:
        namespace.update(extra_globals)
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def load_reference(source: str, backend: str) -> dict[str, Any]:
    ns = exec_module(source, "reference.py")
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if name not in ns:
            raise ValueError(f"reference defines no {name}")
    # Built-in problems carry smaller sizes for the cpu backend; get_inputs reads module globals.
    sizes = ns.get("BACKEND_SIZES", {})
    if isinstance(sizes, dict) and backend in sizes:
        ns.update(sizes[backend])
    return ns


class ExtensionCalls:
    """Counts calls into the candidate's extensions (a defined-but-never-called kernel is a decoy)."""

    def __init__(self) -> None:
        self.count = 0


class _ExtensionProxy:
    def __init__(self, module: Any, calls: ExtensionCalls) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_calls", calls)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value):
            return value
        calls = self._calls

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.count += 1
            return value(*args, **kwargs)

        return counted


def make_load_inline_hook(
    prebuilt: dict[str, tuple[str, str]], calls: ExtensionCalls
) -> Callable[..., Any]:
    """A stand-in for load_inline that imports the parent's pre-built module for the same spec."""
    from kevin_exp.bench.build import BuildResult, import_extension

    real_signature = inspect.signature(torch.utils.cpp_extension.load_inline)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = real_signature.bind(*args, **kwargs)
        spec = ExtensionSpec.from_load_inline_kwargs(dict(bound.arguments))
        entry = prebuilt.get(spec.content_digest())
        if entry is None:
            raise NeedsBuild(spec)
        so_path, module_name = entry
        try:
            module = import_extension(
                BuildResult(so_path=__import__("pathlib").Path(so_path), module_name=module_name, cached=True, seconds=0.0, key="")
            )
        except ImportError as exc:
            raise Rejected("compile_error", f"the built extension failed to load: {exc}", detail=str(exc)) from exc
        return _ExtensionProxy(module, calls)

    return load_inline


# --------------------------------------------------------------------------- inputs and outputs


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    return value


def clone_values(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone_values(v) for v in value)
    return value


def copy_into(dst: list[Any], src: list[Any]) -> None:
    """Overwrite tensors in place, keeping their storage (and data pointers)."""
    for d, s in zip(dst, src):
        if isinstance(d, torch.Tensor):
            d.copy_(s)


def make_inputs(ns: dict[str, Any], seed: int, device: torch.device) -> list[Any]:
    """Seeded inputs, created on ``device`` directly (a GPU fills a 32M-element randn in microseconds
    where the CPU takes a large share of a second; every evaluation draws about a dozen sets)."""
    torch.manual_seed(seed)
    with device:
        inputs = ns["get_inputs"]()
    return [to_device(v, device) for v in inputs]


def same_values(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    return a == b


@dataclass
class Comparison:
    ok: bool
    reason: str = ""
    max_abs_diff: float = 0.0


def compare_outputs(ref: Any, out: Any, config: BenchConfig) -> Comparison:
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(ref):
            return Comparison(False, f"expected a sequence of {len(ref)} outputs, got {type(out).__name__}")
        worst = Comparison(True)
        for i, (r, o) in enumerate(zip(ref, out)):
            c = compare_outputs(r, o, config)
            if not c.ok:
                return Comparison(False, f"output {i}: {c.reason}", c.max_abs_diff)
            worst.max_abs_diff = max(worst.max_abs_diff, c.max_abs_diff)
        return worst
    if not isinstance(ref, torch.Tensor):
        return Comparison(out == ref, "" if out == ref else f"expected {ref!r}, got {out!r}")
    # Exact type: a subclass could compute lazily inside the comparison (kevin-recipe.md 5.9).
    if type(out) is not torch.Tensor:
        return Comparison(False, f"output must be a plain torch.Tensor, got {type(out).__module__}.{type(out).__name__}")
    if out.layout != torch.strided or out.is_meta or out.device != ref.device:
        return Comparison(False, f"output must be a dense tensor on {ref.device}, got layout {out.layout} on {out.device}")
    if out.shape != ref.shape:
        return Comparison(False, f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Comparison(False, f"output dtype {out.dtype} != expected {ref.dtype}")
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        bad = int((~torch.isfinite(out)).sum())
        return Comparison(False, f"output has {bad} NaN/Inf values (unwritten or uninitialised memory?)")
    tol = config.tolerance_for(str(ref.dtype).removeprefix("torch."))
    diff = (out.double() - ref.double()).abs()
    max_diff = float(diff.max()) if diff.numel() else 0.0
    if not bool(torch.allclose(out, ref, atol=tol.atol, rtol=tol.rtol)):
        bad = int((diff > tol.atol + tol.rtol * ref.double().abs()).sum())
        return Comparison(
            False,
            f"output mismatch: {bad} of {ref.numel()} elements outside atol={tol.atol}, rtol={tol.rtol}; "
            f"max abs diff {max_diff:.4g}",
            max_diff,
        )
    return Comparison(True, "", max_diff)


def poison_allocator(like: Any, device: torch.device, copies: int = 3) -> None:
    """Leave NaN in freed allocator blocks of the output's size, so an unwritten output is caught."""
    tensors = [like] if isinstance(like, torch.Tensor) else [t for t in like if isinstance(t, torch.Tensor)] if isinstance(like, (list, tuple)) else []
    held = []
    for t in tensors:
        fill = float("nan") if t.is_floating_point() else -1234567
        for _ in range(copies):
            held.append(torch.full(t.shape, fill, dtype=t.dtype, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    del held


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- timing


class CacheFlusher:
    """Writes a buffer larger than the last-level cache before each timed call."""

    def __init__(self, device: torch.device) -> None:
        if device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            nbytes = max(2 * int(getattr(props, "L2_cache_size", 0) or 0), 64 << 20)
        else:
            nbytes = 2 * _cpu_llc_bytes()
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def flush(self) -> None:
        self.buffer.fill_(1)


def _cpu_llc_bytes() -> int:
    import glob

    best = 8 << 20
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
            value = int(text.rstrip("KMG"))
            value <<= {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
            best = max(best, value)
        except (OSError, ValueError):
            continue
    return min(best, 128 << 20)


class Timer:
    """Times one call; the timed region ends with a device-wide synchronize so work on any stream counts."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._perf = time.perf_counter
        if device.type == "cuda":
            self._sync = torch.cuda.synchronize
            self._event = torch.cuda.Event

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.device.type == "cuda":
            self._sync()
            start, end = self._event(enable_timing=True), self._event(enable_timing=True)
            start.record()
            out = fn()
            self._sync()  # device-wide: side streams created in C++ are waited for too
            end.record()
            end.synchronize()
            return start.elapsed_time(end), out
        t0 = self._perf()
        out = fn()
        return (self._perf() - t0) * 1e3, out


@dataclass
class TimingResult:
    ref_ms: list[float] = field(default_factory=list)
    new_ms: list[float] = field(default_factory=list)


def interleaved_timing(
    ref_model: Any,
    new_model: Any,
    input_sets: list[list[Any]],
    ref_outputs: list[Any],
    device: torch.device,
    config: BenchConfig,
) -> TimingResult:
    """Reference and candidate timed alternately with the same method, on fixed input buffers whose
    values cycle between distinct input sets: a kernel that caches by pointer or skips repeated
    calls returns stale results, which the periodic checks catch."""
    flusher = CacheFlusher(device)
    timer = Timer(device)
    ref_buf = clone_values(input_sets[0])
    new_buf = clone_values(input_sets[0])
    with torch.no_grad():
        for _ in range(config.warmup_trials):
            ref_model(*ref_buf)
            new_model(*new_buf)
        synchronize(device)
        result = TimingResult()
        n_sets = len(input_sets)
        for i in range(config.timed_trials):
            k = i % n_sets
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for which in order:
                buf = ref_buf if which == 0 else new_buf
                model = ref_model if which == 0 else new_model
                copy_into(buf, input_sets[k])
                flusher.flush()
                ms, out = timer(lambda: model(*buf))
                (result.ref_ms if which == 0 else result.new_ms).append(ms)
                check = config.timing_check_every and (i % config.timing_check_every == 0 or i >= config.timed_trials - n_sets)
                if which == 1 and check:
                    cmp = compare_outputs(ref_outputs[k], out, config)
                    if not cmp.ok:
                        raise Rejected(
                            "incorrect",
                            f"wrong output during timed trial {i} ({cmp.reason}); kernels must recompute "
                            "on every call (no caching across calls)",
                        )
                del out
    return result


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
