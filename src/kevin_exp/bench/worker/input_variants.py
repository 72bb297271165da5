"""Inputs the prompt never shows, drawn in the trusted reference process for the hidden checks
(``bench/hidden_checks.py``): other scales and distributions of the problem's floating inputs (integer and
boolean inputs keep their own domain), and a hidden size of the problem (module-level integer sizes that only
``get_inputs`` reads, so ``get_init_inputs`` and ``Model`` are unchanged: the candidate's model stays valid).

A variant on which the reference itself fails or gives non-finite values (log of a negative, a probability
above one) is skipped for the problem, with the reason.
"""
from __future__ import annotations

import contextlib
import math
import random
import types
from typing import Any, Callable, Iterator

import torch

from kevin_exp.bench.exchange import describe, padded_bytes
from kevin_exp.bench.worker.reference import make_inputs
from kevin_exp.bench.worker.tensors import clone_values, synchronize

CAUCHY_CLIP = 1e3  # heavy tails in units of the input's spread, clipped so every value is finite in fp16 too
SPIKE_EVERY = 1000  # about one element in this many becomes a spike
SPIKE_FACTOR = 100.0
MAX_GROWTH = 4.0  # a hidden size's inputs and output may take at most this many times the default's bytes


def transform(name: str, inputs: list[Any], seed: int) -> list[Any]:
    """``inputs`` with every floating tensor redrawn as the distribution ``name`` says (deterministic in ``seed``)."""
    counter = [seed]

    def one(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return type(v)(one(x) for x in v)
        if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.numel() == 0:
            return v
        counter[0] += 1
        return _redraw(name, v, counter[0])
    return [one(v) for v in inputs]


def _redraw(name: str, v: torch.Tensor, seed: int) -> torch.Tensor:
    x = v.double()
    if name == "scale_small":
        return (x * 1e-3).to(v.dtype)
    if name == "scale_large":
        return (x * 1e3).to(v.dtype)
    gen = torch.Generator(device=v.device).manual_seed(seed)
    center = float(x.mean())
    spread = float(x.std()) if x.numel() > 1 else 0.0
    spread = spread if math.isfinite(spread) and spread > 0 else max(abs(center), 1.0)
    nonneg = bool((x >= 0).all())
    if name == "heavy_tail":
        u = torch.rand(v.shape, generator=gen, device=v.device, dtype=torch.float64)
        cauchy = torch.tan(math.pi * (u - 0.5)).clamp(-CAUCHY_CLIP, CAUCHY_CLIP)
        out = center + spread * cauchy
        return (out.abs() if nonneg else out).to(v.dtype)
    if name == "spikes":
        out = x.clone().reshape(-1)
        k = max(1, out.numel() // SPIKE_EVERY)
        where = torch.randint(out.numel(), (k,), generator=gen, device=v.device)
        sign = torch.ones(k, dtype=torch.float64, device=v.device) if nonneg else \
            torch.randint(0, 2, (k,), generator=gen, device=v.device).double() * 2 - 1
        peak = max(float(x.abs().max()), spread)
        out[where] = sign * SPIKE_FACTOR * peak
        return out.reshape(v.shape).to(v.dtype)
    raise ValueError(f"unknown distribution {name!r}")


# ---------------------------------------------------------------------------------------------- hidden sizes

def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _names_read(obj: Any) -> set[str]:
    """Global names a function or class of the program reads (through nested code objects too)."""
    if isinstance(obj, types.FunctionType):
        return _code_names(obj.__code__)
    if isinstance(obj, type):
        names: set[str] = set()
        for member in vars(obj).values():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property):
                for f in (member.fget, member.fset, member.fdel):
                    names |= _names_read(f) if f is not None else set()
            elif isinstance(member, (types.FunctionType, type)):
                names |= _names_read(member)
        return names
    return set()


def shape_names(ns: dict[str, Any]) -> list[str]:
    """Module-level integer sizes read by ``get_inputs`` and by nothing else the program defines (``Model``,
    ``get_init_inputs``, helpers): changing one changes the inputs' shapes and nothing about the model."""
    getter = ns.get("get_inputs")
    if not isinstance(getter, types.FunctionType):
        return []
    mine = ns.get("__name__")
    others: set[str] = set()
    for key, value in ns.items():
        if value is getter or key.startswith("__"):
            continue
        if (isinstance(value, types.FunctionType) and value.__globals__ is ns) or \
                (isinstance(value, type) and value.__module__ == mine):
            others |= _names_read(value)
    return [n for n in sorted(_names_read(getter))
            if isinstance(ns.get(n), int) and not isinstance(ns.get(n), bool) and ns[n] >= 1 and n not in others]


def size_choices(v: int) -> list[int]:
    """Hidden values for a size ``v``: larger (a kernel with constant bounds then reads a prefix, never past the
    input's end), multiples of the power of two that divides ``v`` (up to 16, so vector widths an honest kernel
    relies on still divide), at most a quarter larger (or one step)."""
    step = min(v & -v, 16)
    top = max(v + step, v + v // 4)
    return list(range(v + step, top + 1, step))


@contextlib.contextmanager
def patched(ns: dict[str, Any], values: dict[str, int]) -> Iterator[None]:
    saved = {k: ns[k] for k in values}
    ns.update(values)
    try:
        yield
    finally:
        ns.update(saved)


def finite(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return not out.is_floating_point() or bool(torch.isfinite(out).all())
    if isinstance(out, (list, tuple)):
        return all(finite(x) for x in out)
    return True


def has_floating(values: Any) -> bool:
    if isinstance(values, torch.Tensor):
        return values.is_floating_point()
    if isinstance(values, (list, tuple)):
        return any(has_floating(x) for x in values)
    return False


class Variants:
    """A problem's hidden checks: which apply (probed once on the reference), and each call's inputs."""

    def __init__(self, ns: dict[str, Any], model: Callable[..., Any], device: torch.device,
                 sample: list[Any], sample_out: Any) -> None:
        self.ns, self.model, self.device = ns, model, device
        self.default_bytes = padded_bytes(describe(list(sample))) + padded_bytes(describe(sample_out))
        self.probed: dict[str, str | None] = {}  # name -> None (applies) or why it is skipped
        self.sizes: dict[str, int] = {}  # the hidden size's names, each with its original value
        self.largest_bytes = {"input": 0, "output": 0}

    def _run(self, inputs: list[Any]) -> tuple[Any, str | None]:
        try:
            with torch.no_grad():
                out = self.model(*clone_values(inputs))
            synchronize(self.device)
        except Exception as exc:  # noqa: BLE001 - the reference is undefined there: the check is skipped
            return None, f"the reference raised {type(exc).__name__} on these inputs"
        return (out, None) if finite(out) else (out, "the reference's output is not finite on these inputs")

    def probe(self, name: str, seed: int) -> str | None:
        """Why ``name`` does not apply to this problem (None: it does); probed once."""
        if name not in self.probed:
            self.probed[name] = self._probe_shape() if name == "hidden_shape" else self._probe_distribution(name, seed)
        return self.probed[name]

    def _probe_distribution(self, name: str, seed: int) -> str | None:
        sample = make_inputs(self.ns, seed, self.device)  # drawn again: the problem keeps no inputs alive
        if not has_floating(sample):
            return "the problem has no floating-point inputs"
        return self._run(transform(name, sample, seed))[1]

    def _probe_shape(self) -> str | None:
        names = shape_names(self.ns)
        if not names:
            return "no module-level size is read by get_inputs alone"
        # all sizes together, else greedily those that work together (a size tied to another by its value
        # alone, as N = 2 * M, can only change with it)
        every = {n: self.ns[n] for n in names}
        why = self._try_sizes(every)
        kept = every if why is None else {}
        if why is not None:
            for n in names:
                more = {**kept, n: self.ns[n]}
                fails = self._try_sizes(more)
                kept = more if fails is None else kept
        if not kept:
            return why
        self.sizes = kept  # largest_bytes is from the last set that worked: this one
        return None

    def _try_sizes(self, originals: dict[str, int]) -> str | None:
        largest = self._largest(originals)
        with patched(self.ns, largest):
            try:
                inputs = make_inputs(self.ns, 1, self.device)
            except Exception as exc:  # noqa: BLE001
                return f"get_inputs raised {type(exc).__name__} at another size"
        out, why = self._run(inputs)
        if why:
            return why
        in_b, out_b = padded_bytes(describe(list(inputs))), padded_bytes(describe(out))
        if in_b + out_b > MAX_GROWTH * self.default_bytes:
            return "a larger size would take too much memory"
        self.largest_bytes = {"input": in_b, "output": out_b}
        return None

    def _largest(self, originals: dict[str, int]) -> dict[str, int]:
        return {n: size_choices(v)[-1] for n, v in originals.items()}

    def draw(self, name: str, seed: int) -> tuple[list[Any], Any, dict[str, Any]]:
        """One hidden call's inputs and the reference's output on them, and a record of what was drawn (never
        shown to the model). Raises ``Skipped`` where the reference is undefined on this draw."""
        if name == "hidden_shape":
            rng = random.Random(seed)
            # names of one value keep one value (square matrices stay square)
            by_value = {v: rng.choice(size_choices(v)) for v in sorted(set(self.sizes.values()))}
            for values in ({n: by_value[v] for n, v in self.sizes.items()}, self._largest(self.sizes)):
                with patched(self.ns, values):
                    inputs = make_inputs(self.ns, seed, self.device)
                out, why = self._run(inputs)
                if why is None:
                    return inputs, out, {"sizes": values}
            raise Skipped(why or "")
        base = make_inputs(self.ns, seed, self.device)
        inputs = transform(name, base, seed)
        out, why = self._run(inputs)
        if why:
            raise Skipped(why)
        return inputs, out, {"atol_scale": atol_scale(out, self._run(base)[0])}


def _largest_magnitude(out: Any) -> float:
    if isinstance(out, torch.Tensor):
        return float(out.detach().abs().max()) if out.is_floating_point() and out.numel() else 0.0
    if isinstance(out, (list, tuple)):
        return max((_largest_magnitude(x) for x in out), default=0.0)
    return 0.0


def atol_scale(out: Any, default_out: Any) -> float:
    """How much larger the absolute tolerance is on a redrawn call: its output's largest magnitude over that of the
    reference's output on the same call's own inputs (at least 1). Rounding errors grow with the values summed (a
    matmul on inputs x1e3 has outputs x1e6, and fp32 summed in another order misses an absolute 1e-2 near zero),
    so an honest kernel is held to the same relative accuracy as on the problem's own inputs."""
    big, usual = _largest_magnitude(out), _largest_magnitude(default_out)
    return max(1.0, big / usual) if usual > 0 and math.isfinite(big) else 1.0


class Skipped(Exception):
    """The reference is undefined on this draw of a hidden check."""
