"""Runtime hack defences used inside the evaluation worker (docs/hack_defences.md: hacks 1, 4, 10).

``block_torch_compute()`` is a ``TorchDispatchMode``: every ATen op dispatched while it is active
(from Python *or* from a C++ extension calling ``at::``/``torch::`` functions, since both go through
the dispatcher) is checked against an allow-list of allocation, copy, view and metadata ops; anything
else raises ``ForbiddenOpError`` and is recorded in ``guard.violations``. The record matters because
native code can catch the exception (``try { at::mm(...) } catch (...) {}``) and carry on: the caller
must check ``guard.violations`` after forward returns, whatever happened.

A dispatch mode is thread-local: ops a candidate's C++ runs on other threads (OpenMP, ``at::parallel_for``)
are seen by the op watch instead (``build/op_watch.py``: a global ``RecordFunction`` callback in a small
trusted library, armed for as long as the guard is entered); they are added to ``guard.violations`` when
the guard exits. ``guard.all_threads`` says whether the watch was armed (it is missing when the build cache
holds no op watch library for this torch). Candidate code can switch the watch off on a thread (RecordFunction
is thread-local state) or remove its callback: before the guard exits, the watch checks every thread of torch's
intra-op team (``kx_watch_verify``); a thread where it no longer sees ops is a violation (``WATCH_DISABLED``).

``snapshot_timing_functions`` / ``verify_timing_functions`` detect monkey-patched timers, syncs and
comparison functions (rule ``timing_tampered``).
"""
from __future__ import annotations

import ctypes
import functools
import importlib
import inspect
import os
import sys
from typing import Any, Iterable

from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack, _push_mode

__all__ = [
    "ALLOWED_ATEN_OPS", "ForbiddenOpError", "TorchComputeGuard", "block_torch_compute",
    "TIMING_FUNCTIONS", "snapshot_timing_functions", "verify_timing_functions",
]

# ATen op names (schema name without "aten::") that allocate, copy, convert, view or read metadata.
# Composite ops (reshape, flatten, contiguous, matmul, ...) never reach the mode: they decompose
# first, so e.g. `x.contiguous()` shows up as `clone` and `x @ w` as `mm`.
ALLOWED_ATEN_OPS: frozenset[str] = frozenset("""
    empty empty_like empty_strided empty_permuted new_empty new_empty_strided new_zeros new_ones new_full
    zeros zeros_like ones ones_like full full_like scalar_tensor arange lift lift_fresh lift_fresh_copy
    fill_ fill zero_ copy_ _copy_from _copy_from_and_resize _to_copy clone detach detach_ alias
    _local_scalar_dense is_nonzero resolve_conj resolve_neg _conj _neg_view resize_
    view _unsafe_view _reshape_alias view_as_real view_as_complex as_strided expand slice select
    unsqueeze squeeze permute transpose t split split_with_sizes unbind unfold narrow movedim
    sym_size sym_stride sym_numel sym_storage_offset is_contiguous is_same_size
""".split())


class ForbiddenOpError(RuntimeError):
    """An ATen compute op ran while ``ModelNew.forward`` was under ``block_torch_compute``."""

    def __init__(self, op: str) -> None:
        super().__init__(
            f"{op} is a PyTorch compute op and ran during ModelNew.forward; all computation must happen "
            "in your kernel (only allocation, copies and views are allowed)"
        )
        self.op = op


def op_name(func: Any) -> str:
    """'mm' for aten ops, 'namespace::op' for anything else (custom ops are never allow-listed)."""
    schema = getattr(func, "_schema", None)
    name = getattr(schema, "name", None) or str(func)
    return name.removeprefix("aten::")


WATCH_REMOVED = "<op watch removed>"
WATCH_DISABLED = "<op watch switched off on a thread>"


def op_watch_places() -> list[str]:
    """Build caches the op watch library is looked for in: the sandbox's read-only cache, $KEVIN_EXP_CACHE,
    the default cache."""
    from kevin_exp.bench.worker.sandbox_setup import SANDBOX_CACHE

    places = [SANDBOX_CACHE, os.environ.get("KEVIN_EXP_CACHE", ""),
              os.path.join(os.path.expanduser("~"), ".cache", "kevin_exp")]
    return [p for p in places if p]


@functools.lru_cache(maxsize=1)
def _op_watch() -> ctypes.CDLL | None:
    from kevin_exp.bench.build import op_watch

    for place in op_watch_places():
        path = op_watch.library_in(place)
        if path.exists():
            lib = ctypes.CDLL(str(path))
            lib.kx_watch_arm.argtypes = [ctypes.c_char_p]
            lib.kx_watch_arm.restype = ctypes.c_int
            lib.kx_watch_disarm.argtypes = [ctypes.c_char_p, ctypes.c_long]
            lib.kx_watch_disarm.restype = ctypes.c_long
            if hasattr(lib, "kx_watch_verify"):
                lib.kx_watch_verify.argtypes = [ctypes.c_char_p, ctypes.c_long]
                lib.kx_watch_verify.restype = ctypes.c_long
            return lib
    return None


def loaded_op_watch() -> ctypes.CDLL | None:
    """The op watch library (loaded on first use), or None where the build cache has none for this torch."""
    return _op_watch()


class TorchComputeGuard(TorchDispatchMode):
    """Blocks non-allow-listed ATen ops; ``violations`` keeps every blocked op name in order."""

    def __init__(self, allowed: Iterable[str] = ALLOWED_ATEN_OPS) -> None:
        super().__init__()
        self.allowed = frozenset(allowed)
        self.violations: list[str] = []
        self.all_threads = False
        self._watch: ctypes.CDLL | None = None

    def __enter__(self) -> "TorchComputeGuard":
        lib = _op_watch()
        if lib is not None and lib.kx_watch_arm("\n".join(sorted(self.allowed)).encode()) == 0:
            self._watch, self.all_threads = lib, True
        return super().__enter__()

    def _disarm(self) -> None:
        if self._watch is None:
            return
        verify = getattr(self._watch, "kx_watch_verify", None)
        if verify is not None:
            report = ctypes.create_string_buffer(1024)
            failed = verify(report, len(report))
            if failed > 0:
                shown = "; ".join(report.value.decode(errors="replace").splitlines()[:4])
                self.violations.append(f"{WATCH_DISABLED[:-1]}: {shown}>")
            elif failed == -3:  # another OpenMP runtime than torch's: the check would look at other threads
                self.all_threads = False
        buf = ctypes.create_string_buffer(4096)
        hits = self._watch.kx_watch_disarm(buf, len(buf))
        self._watch = None
        self.violations += [n for n in buf.value.decode(errors="replace").splitlines() if n]
        if hits < 0:
            self.violations.append(WATCH_REMOVED)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Otherwise torch wraps __torch_dispatch__ in torch._dynamo.disable, whose first call imports
        # torch._dynamo: 1-2 CPU-seconds in every fresh worker, i.e. in every evaluated candidate. The
        # guard never runs under torch.compile (a forbidden call in a candidate), so there is nothing to skip.
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = op_name(func)
        if name not in self.allowed:
            self.violations.append(name)
            raise ForbiddenOpError(name)
        return func(*args, **(kwargs or {}))

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        try:
            return self._exit_mode(exc_type, exc_val, exc_tb)
        finally:
            self._disarm()

    def _exit_mode(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> Any:
        stack = _get_current_dispatch_mode_stack()
        if stack and stack[-1] is self:
            return super().__exit__(exc_type, exc_val, exc_tb)
        # The candidate popped or covered the mode (private torch APIs): the process can no longer be
        # trusted (the worker is discarded). If ours was popped, push it back so that exiting restores
        # torch's mode flags; a foreign mode on top is left alone.
        self.violations.append("<dispatch guard removed or replaced>")
        if any(mode is self for mode in stack):
            return False
        _push_mode(self)
        return super().__exit__(exc_type, exc_val, exc_tb)

    @property
    def first_violation(self) -> str | None:
        return self.violations[0] if self.violations else None

    def intact(self) -> bool:
        """True while this guard is the innermost dispatch mode (call inside the ``with`` block)."""
        stack = _get_current_dispatch_mode_stack()
        return bool(stack) and stack[-1] is self


def block_torch_compute(allowed: Iterable[str] = ALLOWED_ATEN_OPS) -> TorchComputeGuard:
    """``with block_torch_compute() as guard: out = model(*inputs)``; then check ``guard.violations``."""
    return TorchComputeGuard(allowed)


# --------------------------------------------------------------------------- timing identities

TIMING_FUNCTIONS: tuple[str, ...] = (
    "time.perf_counter", "time.perf_counter_ns", "time.time", "time.time_ns", "time.monotonic",
    "time.monotonic_ns", "time.process_time", "time.sleep",
    "torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize", "torch.cuda.Event.query", "torch.cuda.Event.wait", "torch.cuda.current_stream",
    "torch.cuda.default_stream", "torch.cuda.Stream", "torch.cuda.Stream.synchronize", "torch.cuda.set_stream",
    "torch.allclose", "torch.isclose", "torch.equal", "torch.isfinite", "torch.full",
    "torch.Tensor", "torch.Tensor.__eq__", "torch.Tensor.__ne__", "torch.Tensor.__gt__", "torch.Tensor.__sub__",
    "torch.Tensor.__bool__", "torch.Tensor.__float__", "torch.Tensor.__int__", "torch.Tensor.double",
    "torch.Tensor.abs", "torch.Tensor.max", "torch.Tensor.sum", "torch.Tensor.all", "torch.Tensor.numel",
    "torch.Tensor.item", "torch.Tensor.clone", "torch.Tensor.copy_", "torch.Tensor.to", "torch.Tensor.cpu",
    "torch.Tensor.is_floating_point", "torch.Tensor.shape", "torch.Tensor.dtype", "torch.Tensor.device",
    "torch.Tensor.__torch_function__", "torch.Tensor.__torch_dispatch__",
    "torch.utils._python_dispatch.TorchDispatchMode.__exit__",
    "kevin_exp.bench.runtime_guard.TorchComputeGuard.__torch_dispatch__",
    "kevin_exp.bench.runtime_guard.TorchComputeGuard.__exit__",
    "builtins.isinstance", "builtins.type", "builtins.float", "builtins.int", "builtins.bool", "builtins.len",
    "builtins.abs", "builtins.max", "builtins.min", "builtins.sum", "builtins.print", "math.isfinite",
)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _resolve(dotted: str) -> object:
    """The raw object behind a dotted name, found without running descriptors (so a classmethod or
    property yields the same object every time)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):  # longest importable module prefix
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None and i == 1:
            try:
                mod = importlib.import_module(parts[0])
            except ImportError:
                return _MISSING
        if mod is not None:
            obj: object = mod
            rest = parts[i:]
            break
    else:  # pragma: no cover - loop always breaks or returns
        return _MISSING
    for j, attr in enumerate(rest):
        try:
            obj = inspect.getattr_static(obj, attr) if j == len(rest) - 1 else getattr(obj, attr)
        except AttributeError:
            return _MISSING
    return obj


def snapshot_timing_functions(extra: Iterable[str] = ()) -> dict[str, object]:
    """Identity of every timing / synchronisation / comparison function (plus ``extra`` dotted names)."""
    return {name: _resolve(name) for name in (*TIMING_FUNCTIONS, *extra)}


def verify_timing_functions(snapshot: dict[str, object]) -> list[str]:
    """Names whose object changed since the snapshot (rule ``timing_tampered``)."""
    return [name for name, obj in snapshot.items() if _resolve(name) is not obj]
