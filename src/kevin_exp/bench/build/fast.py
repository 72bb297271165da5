"""The fast build path: lean headers + PCH for the candidate unit, nvcc in parallel, a cached binding.

Correctness first: a unit that fails with the lean headers is rebuilt with torch's real ones
(unless its errors are plain syntax errors), and anything the split binding cannot express (a
bound lambda, a type only the candidate knows) falls back to torch's own inline binding.
"""
from __future__ import annotations

import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kevin_exp.bench.spec import ExtensionSpec

from . import cache, compiler_input, failures, glue, nvcc_pipe, proc
from .flags import cuda_compile_flags, cuda_home, cuda_ldflags, nvcc_path, toolchain_id, torch_flags
from .lean import LeanHeaders, PchStore, static_digest

# errors the lean headers cannot have caused; anything else triggers a rebuild with full headers
_SYNTAX_ONLY = re.compile(r"error: (expected |stray |missing terminating|unterminated|extra tokens|"
                          r"invalid preprocessing|empty character constant)|error: #error")
_ERROR_LINE = re.compile(r"(\berror\b: |: error [A-Z]?\d*:|\berror #)")
# user flags the binding unit must share with the candidate unit (they change types or ABI)
_ABI_FLAG = re.compile(r"^(-D|-U|-std=|-m(?!arch|tune|cpu)|"
                       r"-f(?!openmp|fast-math|unroll|tree-|no-math|inline|optimize))")
_OPT_FLAG = re.compile(r"^-O([0-3sgz]|fast)?$")


class CompileFailed(Exception):
    def __init__(self, result: proc.ProcResult, unit: str) -> None:
        super().__init__(unit)
        self.result, self.unit = result, unit
        self.log = ""  # every step's output, filled in by FastBuilder.build


@dataclass
class FastInfo:
    steps: list[dict] = field(default_factory=list)
    binding: str = ""
    binding_obj: Path | None = None
    log: str = ""

    def add(self, what: str, res: proc.ProcResult, **extra) -> None:
        self.steps.append({"step": what, "seconds": round(res.seconds, 3), "ok": res.ok, **extra})
        self.steps += [{"step": f"{what}: {part}", "seconds": s, "ok": res.ok} for part, s in res.parts.items()]
        self.log += f"== {what} ({res.seconds:.2f} s)\n{res.describe()}\n"


def lean_may_be_cause(output: str) -> bool:
    errors = [ln for ln in output.splitlines() if _ERROR_LINE.search(ln)]
    return bool(errors) and not all(_SYNTAX_ONLY.search(ln) for ln in errors)


def _inc(dirs: list[Path | str]) -> list[str]:
    return [f"-I{d}" for d in dirs]


class FastBuilder:
    def __init__(self, root: Path, timeout_s: float, memory_limit_gb: float, jobs: int,
                 nvcc_pipeline: bool = True) -> None:
        self.root, self.timeout_s, self.memory_limit_gb, self.jobs = root, timeout_s, memory_limit_gb, jobs
        self.nvcc_pipeline = nvcc_pipeline
        proc.allow_reading(root)  # sandboxed compiles read the lean headers, PCHs and bindings here
        self.lean = LeanHeaders(root, timeout_s, memory_limit_gb)
        self.pch = PchStore(root, self.lean, timeout_s, memory_limit_gb)

    # -- flags ---------------------------------------------------------------------------------
    def cxx_flags(self, spec: ExtensionSpec, with_cuda: bool, split: bool) -> list[str]:
        """Candidate-unit g++ flags as torch orders them, minus -DTORCH_EXTENSION_NAME."""
        tf = torch_flags()
        flags = ["-DKX_NO_PYBIND"] if split else []
        flags += _inc([os.path.abspath(p) for p in spec.extra_include_paths])
        flags += list(tf.common)
        if with_cuda and cuda_home():
            flags += ["-isystem", os.path.join(cuda_home(), "include")]
        return flags + list(tf.cxx_only) + list(spec.extra_cflags)

    def binding_flags(self, spec: ExtensionSpec, with_cuda: bool) -> list[str]:
        tf = torch_flags()
        flags = list(tf.common)
        if with_cuda and cuda_home():
            flags += ["-isystem", os.path.join(cuda_home(), "include")]
        abi = [f for f in spec.extra_cflags if _ABI_FLAG.match(f)]
        # the binding runs at the -O level torch would give it (the candidate's, default -O0): the
        # pybind11 dispatch is in the timed path (measured 0.7 us/call at -O0, 0.23 us at -O2)
        opt = [f for f in spec.extra_cflags if _OPT_FLAG.match(f)][-1:]
        return flags + list(tf.cxx_only) + abi + opt + ["-fvisibility=hidden"]

    # -- units ---------------------------------------------------------------------------------
    def _trusted_cxx(self, lean: list[Path], pch_dir: Path | None, name_define: list[str], src: str,
                     obj: str) -> set[str]:
        """The arguments of a g++ command line that the builder itself puts there."""
        tf = torch_flags()
        out = {tf.cxx, *tf.common, *tf.cxx_only, "-DKX_NO_PYBIND", "-fvisibility=hidden", "-c", "-o", src, obj,
               *name_define, *_inc(lean), *(_inc([pch_dir]) if pch_dir else [])}
        if cuda_home():
            out |= {"-isystem", os.path.join(cuda_home(), "include")}
        return out

    def _compile_cxx(self, flags: list[str], src: str, obj: str, cwd: Path, deadline: float, info: FastInfo,
                     name_define: list[str], what: str, group: proc.Group | None = None,
                     spec: ExtensionSpec | None = None) -> None:
        """``spec``: the candidate whose flags are among ``flags`` (each command line is checked against it before
        it runs); None for the builder's own units."""
        lean = self.lean.dirs()
        if spec is not None:  # before the PCH of these flags is looked up (or built with them)
            compiler_input.check_argv([torch_flags().cxx, *_inc(lean), *name_define, *flags, "-c", src, "-o", obj],
                                      self._trusted_cxx(lean, None, name_define, src, obj), spec, "g++")
        pch_dir = self.pch.get([*_inc(lean), *flags])
        argv = [torch_flags().cxx, *(_inc([pch_dir]) if pch_dir else []), *_inc(lean), *name_define, *flags,
                "-c", src, "-o", obj]
        if spec is not None:
            compiler_input.check_argv(argv, self._trusted_cxx(lean, pch_dir, name_define, src, obj), spec, "g++")
        res = proc.run(argv, cwd, deadline, self.memory_limit_gb, group=group)
        info.add(what, res, lean=True, pch=pch_dir is not None)
        if res.ok:
            return
        if res.timed_out or (group is not None and group.cancelled) or not lean_may_be_cause(res.output):
            raise CompileFailed(res, what)
        argv = [torch_flags().cxx, *name_define, *flags, "-c", src, "-o", obj]
        if spec is not None:
            compiler_input.check_argv(argv, self._trusted_cxx([], None, name_define, src, obj), spec, "g++")
        res = proc.run(argv, cwd, deadline, self.memory_limit_gb, group=group)
        info.add(what + " (full headers)", res, lean=False, pch=False)
        if not res.ok:
            raise CompileFailed(res, what)

    def _nvcc_argv(self, spec: ExtensionSpec, arch: str, module: str, lean: bool) -> list[str]:
        user = _inc([os.path.abspath(p) for p in spec.extra_include_paths])
        return [nvcc_path(), *(_inc(self.lean.dirs()) if lean else []), f"-DTORCH_EXTENSION_NAME={module}", *user,
                *cuda_compile_flags(spec.extra_cuda_cflags, arch), "-c", "cuda.cu", "-o", "cuda.cuda.o"]

    # -- the build -------------------------------------------------------------------------------
    def build(self, spec: ExtensionSpec, module: str, tmp: Path, deadline: float, with_cuda: bool,
              arch: str | None) -> FastInfo:
        info, cu_info = FastInfo(), FastInfo()
        cpp = tuple(glue.rename_literal_module(s, spec.name) for s in spec.cpp_sources)
        split = spec.functions is not None and not glue.needs_pybind(cpp)
        name_define = [f"-DTORCH_EXTENSION_NAME={module}"]
        objs = ["main.o"]
        group = proc.Group()
        cu_thread, cu_error = None, []
        if spec.cuda_sources:
            cu = tuple(glue.rename_literal_module(s, spec.name) for s in spec.cuda_sources)
            (tmp / "cuda.cu").write_text(glue.cuda_source(cu))
            compiler_input.check_unit(tmp / "cuda.cu", spec, module)
            objs.append("cuda.cuda.o")

            def cuda_side() -> None:
                try:
                    self._compile_cuda(spec, arch or "", module, tmp, deadline, cu_info, group)
                except BaseException as exc:  # noqa: BLE001 - handed to the building thread
                    cu_error.append(exc)
                    group.cancel()

            # nvcc (the long pole) runs while g++ builds the C++ unit and its binding
            cu_thread = threading.Thread(target=cuda_side, daemon=True)
            cu_thread.start()
        try:
            try:
                self._build_main(spec, module, cpp, split, tmp, deadline, with_cuda, info, name_define, group)
            except CompileFailed:
                if not cu_error:  # a C++ error: stop nvcc (unless nvcc failed first and stopped us)
                    group.cancel()
                    raise
            if cu_thread is not None:
                cu_thread.join()
                info.steps += cu_info.steps
                info.log += cu_info.log
                if cu_error:
                    raise cu_error[0]
            if info.binding_obj is not None:
                objs.append(str(info.binding_obj))
            ld = cuda_ldflags() if with_cuda else list(torch_flags().ldflags)
            argv = [torch_flags().cxx, *objs, ld[0], *spec.extra_ldflags, *ld[1:], "-o", f"{module}.so"]
            compiler_input.check_argv(argv, {torch_flags().cxx, *objs, *ld, "-o", f"{module}.so"}, spec, "link")
            res = proc.run(argv, tmp, deadline, self.memory_limit_gb)
            info.add("link", res)
            if not res.ok:
                raise CompileFailed(res, "link")
            return info
        except CompileFailed as exc:
            if cu_thread is not None:
                cu_thread.join()
                if cu_info.log not in info.log:
                    info.log += cu_info.log
            exc.log = info.log
            raise
        except BaseException:
            # never leave nvcc writing into a build dir the caller is about to remove
            if cu_thread is not None:
                group.cancel()
                cu_thread.join()
            raise

    def _nvcc(self, argv: list[str], tmp: Path, deadline: float, group: proc.Group,
              spec: ExtensionSpec, arch: str, module: str) -> proc.ProcResult:
        try:
            base = cuda_compile_flags((), arch)
        except ValueError:  # no arch of ours (the candidate's own -arch/-gencode flags choose it)
            base = cuda_compile_flags(spec.extra_cuda_cflags, arch)
        trusted = {nvcc_path(), *_inc(self.lean.dirs()), f"-DTORCH_EXTENSION_NAME={module}", *base,
                   "-c", "cuda.cu", "-o", "cuda.cuda.o"}
        compiler_input.check_argv(argv, trusted, spec, "nvcc")
        if self.nvcc_pipeline:
            res = nvcc_pipe.run(argv, tmp, deadline, self.memory_limit_gb, group)
            if res is not None:
                return res
        return proc.run(argv, tmp, deadline, self.memory_limit_gb, group=group)

    def _compile_cuda(self, spec: ExtensionSpec, arch: str, module: str, tmp: Path, deadline: float,
                      info: FastInfo, group: proc.Group) -> None:
        res = self._nvcc(self._nvcc_argv(spec, arch, module, lean=True), tmp, deadline, group, spec, arch, module)
        info.add("nvcc cuda.cu", res, lean=True)
        if res.ok:
            return
        if res.timed_out or group.cancelled or not lean_may_be_cause(res.output):
            raise CompileFailed(res, "cuda.cu")
        res = self._nvcc(self._nvcc_argv(spec, arch, module, lean=False), tmp, deadline, group, spec, arch, module)
        info.add("nvcc cuda.cu (full headers)", res, lean=False)
        if not res.ok:
            raise CompileFailed(res, "cuda.cu")

    def _build_main(self, spec: ExtensionSpec, module: str, cpp: tuple[str, ...], split: bool, tmp: Path,
                    deadline: float, with_cuda: bool, info: FastInfo, name_define: list[str],
                    group: proc.Group) -> None:
        functions = spec.functions
        if split:
            assert functions is not None
            compiler_input.check_names(functions, module)
            (tmp / "main.cpp").write_text(glue.cpp_source(cpp) + "\n" + glue.split_glue(functions, module))
            compiler_input.check_unit(tmp / "main.cpp", spec, module)
            self._compile_cxx(self.cxx_flags(spec, with_cuda, True), "main.cpp", "main.o", tmp, deadline, info,
                              name_define, "g++ main.cpp", group, spec)
            sigs = glue.read_signatures(tmp / "main.o", len(functions))
            if sigs is not None and glue.NOT_A_FUNCTION not in sigs:
                compiler_input.check_signatures(sigs)
                reg = self.binding(sigs, self.binding_flags(spec, with_cuda), deadline, info, spec)
                if reg is not None:
                    info.binding_obj = reg
                    return
            info.binding = "classic (split binding not possible)"
        else:
            info.binding = "classic" if functions is not None else "source's own PYBIND11_MODULE"
        if functions is not None:
            compiler_input.check_names(functions, module)
        tail = "\n" + glue.classic_binding(functions) if functions is not None else ""
        (tmp / "main.cpp").write_text(glue.cpp_source(cpp) + tail)
        compiler_input.check_unit(tmp / "main.cpp", spec, module)
        self._compile_cxx(self.cxx_flags(spec, with_cuda, False), "main.cpp", "main.o", tmp, deadline, info,
                          name_define, "g++ main.cpp (inline binding)", group, spec)

    # -- cached binding objects -------------------------------------------------------------------
    def binding_key(self, sigs: list[str], flags: list[str]) -> str:
        return cache.digest(["binding-1", toolchain_id(False, self.root), static_digest(), sigs, flags])

    def binding(self, sigs: list[str], flags: list[str], deadline: float, info: FastInfo | None,
                spec: ExtensionSpec | None = None) -> Path | None:
        """The cached binding object of ``sigs`` (``spec``: the candidate whose flags are among ``flags``)."""
        compiler_input.check_signatures(sigs)
        key = self.binding_key(sigs, flags)
        final = cache.entry_dir(self.root, "reg", key)
        if (final / "reg.o").exists():
            if info is not None:
                info.binding = "split, cached binding object"
            return final / "reg.o"
        if (final.parent / f"{key}.failed").exists():
            return None
        with cache.locked(cache.lock_path(final)):
            if (final / "reg.o").exists():
                if info is not None:
                    info.binding = "split, cached binding object"
                return final / "reg.o"
            tmp = cache.new_tmp_dir(final)
            (tmp / "binding.cpp").write_text(glue.binding_source(sigs))
            sub = info if info is not None else FastInfo()
            try:
                self._compile_cxx(flags, "binding.cpp", "reg.o", tmp, deadline, sub, [], "g++ binding.cpp", spec=spec)
            except CompileFailed as exc:
                # a type the binding unit cannot spell: never retry (a failure of the machine's is not remembered)
                if _ERROR_LINE.search(exc.result.output) and not failures.machine_failed(exc.result):
                    (final.parent / f"{key}.failed").write_text(exc.result.describe())
                shutil.rmtree(tmp, ignore_errors=True)
                return None
            cache.write_json(tmp / "meta.json", {"signatures": sigs, "flags": flags, "created": time.time()})
            cache.publish(tmp, final)
            if info is not None:
                info.binding = "split, binding object built"
            return final / "reg.o"
