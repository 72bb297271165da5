"""What a candidate asks to build: the arguments of one ``load_inline`` call, normalised."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ExtensionSpec:
    """Normalised arguments of ``torch.utils.cpp_extension.load_inline``.

    ``functions`` lists the names load_inline binds with pybind11; ``None`` means the sources
    define their own ``PYBIND11_MODULE`` block.
    """

    name: str
    cpp_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[str, ...] | None = None
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_paths: tuple[str, ...] = ()
    with_cuda: bool | None = None

    @property
    def uses_cuda(self) -> bool:
        return bool(self.cuda_sources) if self.with_cuda is None else self.with_cuda

    def content_digest(self) -> str:
        """Hash of everything in the spec except ``name`` (the builder renames modules per digest)."""
        payload = {k: v for k, v in asdict(self).items() if k != "name"}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    @staticmethod
    def from_load_inline_kwargs(kwargs: dict) -> "ExtensionSpec":
        """Build a spec from the keyword arguments a candidate passed to ``load_inline``."""

        def strings(value) -> tuple[str, ...]:
            if value is None:
                return ()
            if isinstance(value, str):
                return (value,)
            return tuple(str(v) for v in value)

        functions = kwargs.get("functions")
        if isinstance(functions, str):
            functions = (functions,)
        elif isinstance(functions, dict):
            functions = tuple(functions)  # docstrings are irrelevant to the build
        elif functions is not None:
            functions = tuple(functions)
        return ExtensionSpec(
            name=str(kwargs.get("name", "ext")),
            cpp_sources=strings(kwargs.get("cpp_sources")),
            cuda_sources=strings(kwargs.get("cuda_sources")),
            functions=functions,
            extra_cflags=strings(kwargs.get("extra_cflags")),
            extra_cuda_cflags=strings(kwargs.get("extra_cuda_cflags")),
            extra_ldflags=strings(kwargs.get("extra_ldflags")),
            extra_include_paths=strings(kwargs.get("extra_include_paths")),
            with_cuda=kwargs.get("with_cuda"),
        )


LOAD_INLINE_PARAMS = (
    "name",
    "cpp_sources",
    "cuda_sources",
    "sycl_sources",
    "functions",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_sycl_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "build_directory",
    "verbose",
    "with_cuda",
    "with_sycl",
    "is_python_module",
    "with_pytorch_error_handling",
    "keep_intermediates",
    "use_pch",
    "no_implicit_headers",
)
"""Positional order of ``load_inline``'s parameters in the torch this project pins (2.13); the worker
binds a candidate's call against the installed torch's real signature instead."""


@dataclass
class CandidateSource:
    """A parsed candidate: its extension specs where they could be resolved statically."""

    specs: list[ExtensionSpec] = field(default_factory=list)
    unresolved_calls: int = 0
