"""Build an ``ExtensionSpec`` (a candidate's ``load_inline`` call) into an importable, cached ``.so``.

``mode="fast"`` (default) gives the module torch's ``load_inline`` would give, built faster:
lean torch headers, a precompiled header per g++ flag set, nvcc running beside g++, and the
pybind11 binding moved into a cached object (see fast.py, glue.py, lean.py). ``mode="torch"``
runs torch's ``load_inline`` itself in a subprocess, as the reference. Finished entries are
content addressed and published atomically; one flock per key makes concurrent builders of the
same key build it once.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kevin_exp.bench.messages import drop_foreign_quotes
from kevin_exp.bench.spec import ExtensionSpec

from . import cache, compiler_input, failures, glue, op_watch, proc, spec_check
from .fast import CompileFailed, FastBuilder
from .flags import resolve_cuda_arch, toolchain_id
from .lean import static_digest
from .torchmode import build_torch

# 2: entries built before every compiler input was checked (compiler_input) may hold code pasted in unchecked
BUILDER_VERSION = "2"
MAX_LOAD_SCALE = 4.0  # a retry gets at most this many times the build time limit
# signatures prebuilt by warm(): the bindings KernelBench-style candidates use most
COMMON_SIGNATURES = (
    ["at::Tensor(at::Tensor)"],
    ["at::Tensor(at::Tensor, at::Tensor)"],
    ["at::Tensor(at::Tensor, at::Tensor, at::Tensor)"],
    ["at::Tensor(const at::Tensor&)"],
    ["at::Tensor(const at::Tensor&, const at::Tensor&)"],
)
WARM_CFLAGS = ((), ("-O3",))


class BuildError(Exception):
    """A failed build. ``str(e)`` is a one-line summary, ``e.log`` the full record (every step, with its command line);
    ``e.diagnostics`` only what the failing compiler said (what feedback to a model may show). ``kind``: ``source``
    (the compiler said the candidate's sources are wrong: kept and replayed), ``infra`` (the machine's: a timeout
    under load, a compiler killed, a tool or the sandbox failing; never kept), ``refused`` (the spec may not be
    built). ``timed_out``: the compiler ran out of time; ``cached``: the same sources failed before and the failure
    was read back; ``attempts``: how many times it was built."""

    def __init__(self, summary: str, log: str = "", timed_out: bool = False, cached: bool = False,
                 kind: str = failures.SOURCE, diagnostics: str = "", attempts: int = 1) -> None:
        super().__init__(summary)
        self.log, self.timed_out, self.cached = log, timed_out, cached
        self.kind = failures.INFRA if timed_out else kind
        self.diagnostics, self.attempts = diagnostics, attempts
        self.limits_s: list[float] = []  # the time limit of each attempt


@dataclass(frozen=True)
class BuildResult:
    so_path: Path
    module_name: str
    cached: bool
    seconds: float
    key: str


def _first_error(output: str) -> str:
    # ld's own complaint ("ld: cannot find -lc10") comes before collect2's "error: ld returned 1 exit status"
    for line in output.splitlines():
        if re.search(r"\berror\b|\bld: cannot find\b", line, flags=re.I):
            return line.strip()[:300]
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no compiler output"


class Builder:
    def __init__(self, cache_dir: Path, backend: str = "cpu", mode: str = "fast", cuda_arch: str | None = None,
                 timeout_s: float = 300.0, memory_limit_gb: float = 8.0, jobs: int = 0) -> None:
        if backend not in ("cpu", "cuda"):
            raise ValueError(f"backend={backend!r}: expected 'cpu' or 'cuda'")
        if mode not in ("fast", "torch"):
            raise ValueError(f"mode={mode!r}: expected 'fast' or 'torch'")
        self.cache_dir = Path(cache_dir)
        self.backend, self.mode = backend, mode
        self._cuda_arch = cuda_arch
        self.timeout_s, self.memory_limit_gb = timeout_s, memory_limit_gb
        self.jobs = jobs if jobs > 0 else (os.cpu_count() or 1)
        self.fast = FastBuilder(self.cache_dir, timeout_s, memory_limit_gb, self.jobs)
        # the runtime guard's all-threads op watch, loaded by workers from this cache (built once per torch version)
        self.op_watch, self.op_watch_note = op_watch.build(self.cache_dir, timeout_s, memory_limit_gb)

    # -- keys and lookup --------------------------------------------------------------------------
    @property
    def cuda_arch(self) -> str:
        if self._cuda_arch is None:
            try:
                self._cuda_arch = resolve_cuda_arch(None)
            except ValueError as exc:
                raise BuildError(str(exc)) from exc
        return self._cuda_arch

    def _with_cuda(self, spec: ExtensionSpec) -> bool:
        return self.backend == "cuda" and spec.uses_cuda

    def cache_key(self, spec: ExtensionSpec) -> str:
        with_cuda = self._with_cuda(spec)
        payload = {
            "builder": BUILDER_VERSION,
            "mode": self.mode,
            "backend": self.backend,
            "arch": self.cuda_arch if with_cuda else None,
            # sources as compiled: the spec's name only matters through a literal PYBIND11_MODULE
            "cpp": [glue.rename_literal_module(s, spec.name) for s in spec.cpp_sources],
            "cuda": [glue.rename_literal_module(s, spec.name) for s in spec.cuda_sources],
            "rest": {k: getattr(spec, k) for k in ("functions", "extra_cflags", "extra_cuda_cflags",
                                                   "extra_ldflags", "extra_include_paths", "with_cuda")},
            "toolchain": toolchain_id(with_cuda, self.cache_dir),
            "lean": static_digest() if self.mode == "fast" else None,
        }
        return cache.digest(payload)

    @staticmethod
    def module_name(key: str) -> str:
        return f"kx_{key[:16]}"

    def _entry(self, key: str) -> Path:
        return cache.entry_dir(self.cache_dir, "ext", key)

    def _hit(self, key: str, t0: float) -> BuildResult | None:
        """The cached build of ``key``; raises its cached BuildError where the same sources failed before."""
        module = self.module_name(key)
        so = self._entry(key) / f"{module}.so"
        if so.exists() and (so.parent / "meta.json").exists():
            return BuildResult(so, module, True, time.perf_counter() - t0, key)
        failed = self._failure(key)
        if failed.exists():
            try:
                record = json.loads(failed.read_text())
            except (OSError, ValueError):
                return None
            if record.get("kind") == failures.SOURCE:  # older records did not say whose fault it was
                raise BuildError(record["summary"], record.get("log", ""), cached=True,
                                 diagnostics=record.get("diagnostics", ""))
        return None

    def _failure(self, key: str) -> Path:
        return cache.entry_dir(self.cache_dir, "failed", key) / "failure.json"

    def _remember_failure(self, key: str, error: BuildError) -> None:
        """A compile error is a property of the sources and flags (the key): the next identical candidate gets
        the same verdict without compiling. Only failures the compiler blamed on the candidate's own sources are
        kept: a timeout, a killed compiler or a failing toolchain says nothing about the next try."""
        if error.kind != failures.SOURCE:
            return
        path = self._failure(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        cache.write_json(tmp, {"summary": str(error), "log": error.log, "diagnostics": error.diagnostics,
                               "kind": error.kind, "builder": BUILDER_VERSION})
        os.replace(tmp, path)

    def lookup(self, spec: ExtensionSpec) -> BuildResult | None:
        """The cached build of ``spec``, or None (not built yet, or failed)."""
        t0 = time.perf_counter()
        try:
            return self._hit(self.cache_key(spec), t0)
        except BuildError:
            return None

    # -- building ---------------------------------------------------------------------------------
    def _check(self, spec: ExtensionSpec) -> None:
        if self.backend == "cpu" and (spec.cuda_sources or spec.with_cuda):
            raise BuildError("the cpu backend cannot build CUDA sources (cuda_sources / with_cuda=True)")
        if not spec.cpp_sources and not spec.cuda_sources:
            raise BuildError("the extension has no sources")
        problems = spec_check.spec_problems(spec)
        if problems:
            raise BuildError(problems[0], "\n".join(problems), kind=failures.REFUSED)

    def build(self, spec: ExtensionSpec) -> BuildResult:
        t0 = time.perf_counter()
        self._check(spec)
        key = self.cache_key(spec)
        hit = self._hit(key, t0)
        if hit is not None:
            return hit
        final = self._entry(key)
        with cache.locked(cache.lock_path(final)):
            hit = self._hit(key, t0)  # built by another process while we waited for the lock
            if hit is not None:
                return hit
            tmp, meta = self._build_with_retry(spec, key, final)
            try:
                meta["seconds"] = round(time.perf_counter() - t0, 3)
                cache.write_json(tmp / "meta.json", meta)
                _hide_all_but_the_module(tmp)
                cache.publish(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        module = self.module_name(key)
        return BuildResult(final / f"{module}.so", module, False, time.perf_counter() - t0, key)

    def _build_with_retry(self, spec: ExtensionSpec, key: str, final: Path) -> tuple[Path, dict]:
        """(the finished build folder, its meta). A failure that is the machine's is built once more, with the time
        limit scaled by the machine's load; if that fails too it is an ``infra`` BuildError. Only a failure the
        compiler blamed on the sources is remembered."""
        timeout_s, limits = self.timeout_s, []
        for attempt in (1, 2):
            tmp = cache.new_tmp_dir(final)
            limits.append(round(timeout_s, 3))
            try:
                meta = self._build_into(spec, key, tmp, timeout_s)
                meta["attempts"], meta["limits_s"] = attempt, limits
                return tmp, meta
            except BuildError as error:
                shutil.rmtree(tmp, ignore_errors=True)
                error.attempts, error.limits_s = attempt, limits
                if error.kind == failures.INFRA and attempt == 1:
                    timeout_s = self.timeout_s * min(MAX_LOAD_SCALE, failures.load_scale())
                    continue
                self._remember_failure(key, error)
                raise
            except compiler_input.Refused as exc:  # the final gate: nothing of it was compiled
                shutil.rmtree(tmp, ignore_errors=True)
                raise BuildError(str(exc), str(exc), kind=failures.REFUSED) from None
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        raise AssertionError("unreachable")

    def _build_into(self, spec: ExtensionSpec, key: str, tmp: Path, timeout_s: float | None = None) -> dict:
        module = self.module_name(key)
        with_cuda = self._with_cuda(spec)
        arch = self.cuda_arch if with_cuda else None
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        meta = {"key": key, "module": module, "mode": self.mode, "backend": self.backend, "arch": arch,
                "spec_name": spec.name, "pid": os.getpid(), "host": os.uname().nodename, "created": time.time(),
                "builder": BUILDER_VERSION, "sandbox": proc.sandbox_note()}
        if self.mode == "torch":
            res = build_torch(spec, module, tmp, deadline, self.memory_limit_gb, self.jobs, arch)
            (tmp / "build.log").write_text(res.describe())
            if not res.ok:
                raise self._error(res, "load_inline", timeout_s=timeout_s)
            for junk in tmp.glob("*.o"):
                junk.unlink()
            return meta
        try:
            info = self.fast.build(spec, module, tmp, deadline, with_cuda, arch)
        except CompileFailed as exc:
            raise self._error(exc.result, exc.unit, earlier=exc.log, timeout_s=timeout_s) from None
        (tmp / "build.log").write_text(info.log)
        for junk in ("main.o", "cuda.cuda.o"):
            (tmp / junk).unlink(missing_ok=True)
        return {**meta, "steps": info.steps, "binding": info.binding}

    def _error(self, res: proc.ProcResult, unit: str, earlier: str = "", timeout_s: float | None = None) -> BuildError:
        # the failing compiler's own output first: that is what feedback to a model should show; never
        # a quote of a file outside the candidate's sources and the toolkit's headers
        output = drop_foreign_quotes(res.output)
        log = f"{output}\n$ {shlex.join(res.argv)}\n" + (f"\n== all build steps ==\n{drop_foreign_quotes(earlier)}" if earlier else "")
        kind = failures.classify(res)
        if res.timed_out:
            limit = self.timeout_s if timeout_s is None else timeout_s
            return BuildError(f"build timed out after {limit:g} s ({unit})", log, timed_out=True)
        if kind == failures.INFRA:
            return BuildError(f"{unit} failed for reasons of the build machine: {_first_error(output)}", log, kind=kind)
        return BuildError(f"{unit} failed: {_first_error(output)}", log, kind=kind,
                          diagnostics=failures.diagnostics(output))

    # -- warm-up ------------------------------------------------------------------------------------
    def warm(self) -> None:
        """Build the lean headers, the PCHs of the common flag sets and the common bindings."""
        if self.mode != "fast":
            return
        with_cuda = self.backend == "cuda"
        fb = self.fast
        lean = [f"-I{d}" for d in fb.lean.dirs()]
        specs = [ExtensionSpec(name="warm", cpp_sources=("",), extra_cflags=c, with_cuda=with_cuda or None)
                 for c in WARM_CFLAGS]
        bind_sets = [fb.binding_flags(s, with_cuda) for s in specs]
        pch_sets = [fb.cxx_flags(s, with_cuda, True) for s in specs] + bind_sets
        deadline = time.monotonic() + self.timeout_s
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            list(pool.map(lambda f: fb.pch.get([*lean, *f], build=True), pch_sets))
            jobs = [(sigs, flags) for flags in bind_sets for sigs in COMMON_SIGNATURES]
            list(pool.map(lambda job: fb.binding(job[0], job[1], deadline, None), jobs))


def _hide_all_but_the_module(entry: Path) -> None:
    """Sandboxed workers (another uid) read the cache: they may load the module, never read a candidate's
    sources or build log."""
    for path in entry.iterdir():
        if path.is_file() and path.suffix != ".so":
            path.chmod(0o600)


_import_lock = threading.Lock()


def import_extension(result: BuildResult) -> types.ModuleType:
    """Import the built ``.so`` as ``result.module_name`` (torch is imported first: the extension
    links against libtorch, which must already be loaded)."""
    import torch  # noqa: F401

    with _import_lock:
        module = sys.modules.get(result.module_name)
        if module is not None:
            return module
        path = str(result.so_path)
        loader = importlib.machinery.ExtensionFileLoader(result.module_name, path)
        spec = importlib.util.spec_from_file_location(result.module_name, path, loader=loader)
        if spec is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        sys.modules[result.module_name] = module
        return module


__all__ = ["BuildError", "BuildResult", "Builder", "import_extension"]
