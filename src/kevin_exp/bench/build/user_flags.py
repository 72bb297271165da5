"""The build flags a candidate may pass to ``load_inline`` (an allow-list).

Compilers run outside the run sandbox, and their flags can run programs or write files: g++'s
``-wrapper sh,-c,CMD`` and ``-fplugin=``, ``-specs=``, ``-B``, ``@file``, ``-o``, ``-Wl,``/``-Xlinker``
options, nvcc's ``-ccbin`` and ``--keep-dir``. Only flags that change how code is optimised or checked are
accepted; empty strings (KernelBench candidates write ``extra_cflags=[""]``) are ignored.
"""
from __future__ import annotations

import re

from kevin_exp.bench.spec import ExtensionSpec

_GXX = re.compile(
    r"-O[0-3sgz]?|-Ofast|-std=(?:c|gnu)\+\+\d\w|-g[0-3]?|-w|-pedantic|"
    r"-m(?:arch|tune|cpu)=[\w.\-]+|-m(?:no-)?[a-z0-9][a-z0-9.\-]*|"
    r"-W(?!l,|a,|p,)(?:no-)?[a-z][a-z0-9+\-]*(?:=\w+)?|"
    r"-f(?:no-)?(?:fast-math|unroll-loops|unroll-all-loops|openmp|openmp-simd|tree-vectorize|tree-loop-vectorize|"
    r"tree-slp-vectorize|strict-aliasing|omit-frame-pointer|inline-functions|inline|math-errno|finite-math-only|"
    r"associative-math|reciprocal-math|unsafe-math-optimizations|trapping-math|signed-zeros|fp-contract=\w+|"
    r"vect-cost-model(?:=\w+)?|PIC|pic|rtti|exceptions|permissive|signed-char|unsigned-char|"
    r"prefetch-loop-arrays|peel-loops|ipa-\w[\w\-]*|lto|visibility=\w+|diagnostics-color(?:=\w+)?|"
    r"max-errors=\d+|excess-precision=\w+)|"
    r"-fopt-info(?:-[a-z\-]+)?|-pthread"
)
# vendor libraries are safe to link: whether a candidate may use them is the switchable reward rule
# `native_library_compute`, not this list
_LD = re.compile(r"-l(?:m|gomp|cuda|cudart|pthread|cublas|cublasLt|cudnn|cufft|curand|cusparse|cusolver)|"
                 r"-fopenmp|-pthread|-O[0-3s]?|-s")
_NVCC_ARCH = r"(?:compute|sm|lto)_\d+[af]?"
_NVCC = re.compile(
    r"-O[0-3]|-lineinfo|--?use[_-]fast[_-]math|--?(?:ftz|prec-div|prec-sqrt|fmad)=(?:true|false)|"
    r"--?std=c\+\+\d\d|--?expt-relaxed-constexpr|--?expt-extended-lambda|"
    r"--?extended-lambda|--?maxrregcount=\d+|-Xptxas=-v|-Xptxas=--?(?:verbose|warn-\w[\w\-]*|O[0-3])|"
    r"--ptxas-options=(?:-v|--?verbose|-O[0-3])|--?res(?:ource)?-usage|--restrict|-g|-G|-w|--?keep-device-functions|"
    r"--?(?:gpu-)?arch(?:itecture)?=" + _NVCC_ARCH + r"|"
    r"-gencode=arch=" + _NVCC_ARCH + r",code=(?:\[?" + _NVCC_ARCH + r"(?:," + _NVCC_ARCH + r")*\]?)|"
    r"--?default-stream=(?:legacy|per-thread)|--generate-line-info|--?threads=\d+|-t=\d+"
)
# -D/-U: a macro is a plain identifier, its value (if any) a number. A value that is an identifier or code would
# rename what the native rules read (`-DOP=relu` and `x.OP()`), so it is refused; so are the names the build
# itself defines or torch's headers read (KX_NO_PYBIND, kx_*, TORCH_*, C10_*, ...) and reserved names, except
# undefining CUDA's half-precision switches (`-U__CUDA_NO_HALF_OPERATORS__`, as torch extensions often do).
_MACRO = re.compile(r"-([DU])([A-Za-z_]\w*)(?:=([+\-]?\.?\d(?:[eEpP][+\-]|[\w.])*))?")
_MACRO_NAME_DENY = re.compile(r"KX_NO_PYBIND\b|kx_|TORCH_|C10_|AT_|CAFFE2_|PYBIND11|Py|PY|_")
_MACRO_UNDEF_OK = re.compile(r"__CUDA_NO_\w+__")


def macro_ok(flag: str) -> bool:
    m = _MACRO.fullmatch(flag)
    if m is None:
        return False
    kind, name, value = m.groups()
    if kind == "U":
        return value is None and (_MACRO_UNDEF_OK.fullmatch(name) is not None or not _MACRO_NAME_DENY.match(name))
    return not _MACRO_NAME_DENY.match(name)


# nvcc options whose value comes as the next argument
_NVCC_PAIRED = {"-Xptxas", "--ptxas-options", "-arch", "--gpu-architecture", "-gencode", "--generate-code",
                "-maxrregcount", "--maxrregcount", "-Xcompiler", "--compiler-options", "-std", "--std",
                "--threads", "-t"}

ALLOWED_SUMMARY = (
    "C++: -O*, -std=c++NN, -DNAME / -DNAME=<number> / -UNAME, -g, -march/-mtune/-m<isa>, -W<warning>, -f<optimisation> "
    "(fast-math, unroll-loops, openmp, ...), -pthread; CUDA: -O*, --use_fast_math, --ftz/--prec-div/"
    "--prec-sqrt/--fmad, -lineinfo, -std=c++NN, -D/-U, --expt-relaxed-constexpr, --extended-lambda, "
    "-maxrregcount, -Xptxas -v/-O*, -arch/-gencode, -Xcompiler with the C++ flags above; "
    "link: -lm, -lgomp, -lcuda, -lcudart, -fopenmp (vendor libraries only where that rule is off)"
)


def _gxx_ok(flag: str) -> bool:
    if flag.startswith(("-D", "-U")):
        return macro_ok(flag)
    return _GXX.fullmatch(flag) is not None


def _host_flags_unsafe(prefix: str, value: str) -> list[str]:
    """The refused ones among the comma-separated host-compiler flags nvcc passes on (-Xcompiler)."""
    return [prefix + v for v in value.split(",") if v.strip() and not _gxx_ok(v.strip())]


def _nvcc_unsafe(flags: tuple[str, ...]) -> list[str]:
    bad: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i].strip()
        i += 1
        if not flag:
            continue
        if flag in _NVCC_PAIRED:
            value = flags[i].strip() if i < len(flags) else ""
            i += 1
            flag_value = f"{flag}={value}"
            if flag in ("-Xcompiler", "--compiler-options"):
                bad += _host_flags_unsafe(f"{flag} ", value)
            elif not _NVCC.fullmatch(flag_value.replace("--ptxas-options=", "-Xptxas=")
                                     .replace("--gpu-architecture=", "-arch=").replace("--generate-code=", "-gencode=")):
                bad.append(f"{flag} {value}")
            continue
        if flag.startswith(("-Xcompiler=", "--compiler-options=")):
            option, value = flag.split("=", 1)
            bad += _host_flags_unsafe(f"{option}=", value)
            continue
        if flag.startswith(("-D", "-U")) and macro_ok(flag):
            continue
        if not _NVCC.fullmatch(flag):
            bad.append(flag)
    return bad


def unsafe_flags(spec: ExtensionSpec) -> list[str]:
    """The flags of ``spec`` outside the allow-list (empty when every flag is accepted)."""
    bad = [f for f in spec.extra_cflags if f.strip() and not _gxx_ok(f.strip())]
    bad += [f for f in spec.extra_ldflags if f.strip() and _LD.fullmatch(f.strip()) is None]
    bad += _nvcc_unsafe(tuple(spec.extra_cuda_cflags))
    return bad


def describe(flags: list[str]) -> str:
    shown = ", ".join(repr(f) for f in flags[:3])
    return (f"build flag(s) {shown} not allowed (they could run programs or write files at build time, or make the "
            f"compiler read other code than the checked sources); allowed: {ALLOWED_SUMMARY}")
