"""The reference program: the problem's own code (trusted), loaded with the sizes for this backend, and
the seeded inputs it draws; ``exec_module`` runs a program's source in a fresh namespace (``candidate``
uses it for the candidate)."""
from __future__ import annotations

from typing import Any

import torch

from kevin_exp.bench.worker.tensors import to_device


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


def make_inputs(ns: dict[str, Any], seed: int, device: torch.device) -> list[Any]:
    """Seeded inputs, created on ``device`` directly (a GPU fills a 32M-element randn in microseconds
    where the CPU takes a large share of a second; every evaluation draws about a dozen sets)."""
    torch.manual_seed(seed)
    with device:
        inputs = ns["get_inputs"]()
    return [to_device(v, device) for v in inputs]
