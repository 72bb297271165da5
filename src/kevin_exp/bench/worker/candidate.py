"""Loading the candidate: candidate code enters the worker here. Its ``load_inline`` calls import the
modules the parent built for the same spec, and every call into them is counted (a kernel that is defined
but never called is a decoy)."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import torch

from kevin_exp.bench.spec import ExtensionSpec
from kevin_exp.bench.worker.outcomes import NeedsBuild, Rejected
from kevin_exp.bench.worker.reference import exec_module


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
    from kevin_exp.bench.build.builder import BuildResult, import_extension

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
                BuildResult(so_path=Path(so_path), module_name=module_name, cached=True, seconds=0.0, key="")
            )
        except ImportError as exc:
            raise Rejected("compile_error", f"the built extension failed to load: {exc}", detail=str(exc)) from exc
        return _ExtensionProxy(module, calls)

    return load_inline


def hook_load_inline(prebuilt: dict[str, tuple[str, str]], calls: ExtensionCalls) -> None:
    """Replace ``torch.utils.cpp_extension.load_inline`` before the candidate module runs."""
    import torch.utils.cpp_extension as cpp_extension

    cpp_extension.load_inline = make_load_inline_hook(prebuilt, calls)


def load_candidate(source: str) -> dict[str, Any]:
    """Run the candidate module (after ``hook_load_inline``); its namespace."""
    return exec_module(source, "candidate.py")
