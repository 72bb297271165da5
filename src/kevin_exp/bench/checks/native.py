"""The native rules: one ``load_inline`` extension's C++/CUDA sources, checked after comments and string
literals are stripped (ATen/torch library calls, vendor libraries, dispatcher tricks, threads and streams,
calls back into Python, a kernel that is really there), and its build flags."""
from __future__ import annotations

import re
from typing import Callable

from kevin_exp.bench.build import user_flags
from kevin_exp.bench.checks.rules import (
    KERNEL_RULE,
    SYNC_RULE,
    TENSOR_COMPUTE_METHODS,
    Violation,
    rule_enabled,
    words,
)
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

# Unterminated comments/literals run to the end (of the text or line) so that no input makes the
# scan quadratic; the compiler rejects such code anyway.
_COMMENT_OR_LITERAL = re.compile(
    r'//[^\n]*|/\*.*?(?:\*/|\Z)|R"(?P<d>[^()\\\s]{0,16})\(.*?(?:\)(?P=d)"|\Z)|"(?:\\.|[^"\\\n])*"?|'
    r"'(?:\\.|[^'\\\n])*'?", re.S)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_ROOTS = ("at", "aten", "torch", "c10", "caffe2")
_NS_ALIAS = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+((?:::)?\w+(?:\s*::\s*\w+)*)[ \t]*$|"
                       r"\bnamespace\s+(\w+)\s*=\s*((?:::)?\w+(?:\s*::\s*\w+)*)\s*;", re.M)
_USING_NS = re.compile(r"\busing\s+namespace\s+(?:::)?(at|aten|torch)\b")
_METHOD_CALL = re.compile(r"(?:\.|->)\s*(\w+)\s*(?:<[^;(){}]*>)?\s*\(")
_KERNEL = re.compile(r"\b__global__\b")
_LAUNCH = re.compile(r"<<<|\bcu(?:da)?Launch(?:Cooperative)?Kernel(?:Ex)?\b")
_VENDOR = re.compile(r"\b(?:(?i:cublas|cudnn|cusparse|cusolver|cufft)\w*|cblas_\w+|mkl_\w+|MKL_\w+|dnnl\w*|"
                     r"mkldnn\w*|openblas\w*|[sdcz]gemm_|dlopen|dlsym)\b|\b(?:cutlass|cute|thrust|Eigen)\s*::|"
                     r"\bcub\s*::\s*Device\w*")
_VENDOR_INCLUDE = re.compile(r"(?i)^(?:cublas|cudnn|cusparse|cusolver|cufft|cutlass/|cute/|cblas|mkl|dnnl|mkldnn|"
                             r"oneapi/dnnl|eigen|openblas|ATen/cuda/CUDABlas|ATen/cudnn/|cub/device/)")
_VENDOR_FLAG = re.compile(r"(?i)cublas|cudnn|cusparse|cusolver|cufft|mkl|openblas|blas|dnnl|lapack|cutlass|eigen")
_DISPATCH = re.compile(r"\b(?:DispatchKey\w*|\w*DispatchKeyGuard|AutoDispatch\w+|\w*LocalDispatchKeySet|Dispatcher|"
                       r"OperatorHandle|redispatch|TORCH_LIBRARY\w*|PythonTLSSnapshot|ThreadLocalStateGuard)\b")
_NATIVE_CONCURRENCY = re.compile(
    r"\b(?:cudaStreamCreate\w*|cuStreamCreate\w*|pthread_create|getStreamFromPool|getStreamFromExternal|"
    r"setCurrentCUDAStream|\w*CUDAStreamGuard|CUDAMultiStreamGuard|cudaLaunchHostFunc|cuLaunchHostFunc|"
    r"cudaStreamAddCallback)\b|\bstd\s*::\s*(?:thread|jthread|async)\b|(?<![\w.:>])v?fork\s*\(")
_NATIVE_UNSAFE = re.compile(  # Python C-API / pybind11 calls back into Python, processes, memory tricks
    r"\b(?:Py[A-Z][A-Za-z]*_\w+|Py_\w+|mprotect|ptrace|process_vm_writev)\b|(?:\.|->)\s*attr\s*\(|"
    r"(?<![\w.:>])(?:system|popen|exec[lv]p?e?)\s*\(|"
    r"\b(?:py|pybind11)\s*::\s*(?:module_?\s*::\s*import|exec|eval\w*|globals)\b")
NATIVE_ALLOWED = words("""empty empty_like empty_strided zeros zeros_like ones ones_like full full_like from_blob
    Tensor TensorBase TensorOptions IntArrayRef ArrayRef OptionalIntArrayRef ScalarType Device DeviceType
    DeviceGuard OptionalDeviceGuard Layout MemoryFormat Scalar Half BFloat16 dtype device layout requires_grad
    memory_format TensorAccessor PackedTensorAccessor PackedTensorAccessor32 PackedTensorAccessor64
    GenericPackedTensorAccessor RestrictPtrTraits DefaultPtrTraits irange ceil_div optional nullopt toString
    elementSize isFloatingType isIntegralType isComplexType acc_type opmath_type numeric_limits device_of
    indexing NoGradGuard parallel_for get_num_threads get_thread_num Error""")
NATIVE_ALLOWED_PATHS = words("""cuda::getCurrentCUDAStream cuda::getDefaultCUDAStream cuda::CUDAGuard
    cuda::OptionalCUDAGuard cuda::CUDAStream cuda::getCurrentDeviceProperties cuda::getDeviceProperties
    cuda::current_device cuda::device_count cuda::warp_size vec::Vectorized internal::GRAIN_SIZE""")
_NATIVE_METHOD_DENY = TENSOR_COMPUTE_METHODS - words("any all numpy apply_ map_ map2_")
# Called unqualified only after `using namespace at/torch`; C math names (exp, max, ...) are excluded.
_BARE_DENY = words("""matmul mm bmm addmm baddbmm einsum conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    conv_transpose3d linear softmax log_softmax layer_norm batch_norm group_norm instance_norm max_pool1d
    max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool2d relu gelu silu mish hardtanh
    leaky_relu elu selu softplus dropout logsumexp cumsum cumprod argmax argmin topk cat stack sum mean prod var
    std norm where masked_fill index_select gather scatter clamp sigmoid""")


def strip_native(text: str, keep_strings: bool = False) -> str:
    """Source with comments removed and (unless keep_strings) string/char literals emptied; line
    continuations are spliced first, as the preprocessor does."""
    text = text.replace("\\\r\n", "").replace("\\\n", "")

    def sub(m: re.Match[str]) -> str:
        s = m.group(0)
        if s[:2] in ("//", "/*"):
            return " " + "\n" * s.count("\n")
        return s if keep_strings else '""' + "\n" * s.count("\n")

    return _COMMENT_OR_LITERAL.sub(sub, text)


def _native_path(root: str, parts: list[str]) -> tuple[str, str] | None:
    path = "::".join(parts)
    name = f"{root}::{path}"
    if any(_NATIVE_CONCURRENCY.fullmatch(p) for p in parts):
        return None  # reported by the concurrency scan
    if any(_DISPATCH.fullmatch(p) for p in parts) or parts[0] in ("impl", "_ops"):
        return "native_library_compute", f"{name} reaches into the dispatcher (bypassing the op checks); not allowed"
    if root in ("c10", "caffe2"):
        return None
    if parts[0] in ("Tensor", "TensorBase"):
        if len(parts) > 1 and parts[1] in _NATIVE_METHOD_DENY:
            return "native_library_compute", f"{name} is an ATen compute op; {KERNEL_RULE}"
        return None
    if parts[0] in NATIVE_ALLOWED or re.fullmatch(r"k[A-Z]\w*", parts[0]) or any(
            path == p or path.startswith(p + "::") for p in NATIVE_ALLOWED_PATHS):
        return None
    return "native_library_compute", (f"{name} is an ATen/torch library call (only allocation, tensor "
                                      f"metadata and stream/guard helpers are allowed); {KERNEL_RULE}")


def _defines(code: str, fn: str) -> bool:
    pattern = rf"\b{re.escape(fn)}\s*\([^;{{}}]*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:->[^;{{]+)?\{{"
    return re.search(pattern, code) is not None


def check_native(spec: ExtensionSpec, backend: str, rules: CheckRules) -> list[Violation]:
    """Rules on one extension's C++/CUDA sources (comments and string literals stripped first)."""
    out: list[Violation] = []
    seen: set[tuple[str, str]] = set()

    def add(rule: str, where: str | tuple[str, str, int], key: str, text: str) -> None:
        """One violation per (rule, token); the line is only worked out for reported ones."""
        if not rule_enabled(rule, rules) or (rule, key) in seen:
            return
        seen.add((rule, key))
        if isinstance(where, tuple):
            label, code, pos = where
            where = f" ({label} line {code.count(chr(10), 0, pos) + 1})"
        out.append(Violation(rule, f"extension {spec.name!r}{where}: {text}"))

    sources: list[tuple[str, str, str]] = []  # (label, code with literals, code without)
    for kind, texts in (("cpp_sources", spec.cpp_sources), ("cuda_sources", spec.cuda_sources)):
        for i, text in enumerate(texts):
            label = kind if len(texts) == 1 else f"{kind}[{i}]"
            # include lines are judged by their target, once, so they are blanked from the code scan
            sources.append((label, strip_native(text, keep_strings=True), _INCLUDE.sub("", strip_native(text))))
    everything = "\n".join(code for _, _, code in sources)
    aliases: dict[str, list[str]] = {r: [r] for r in _ROOTS}
    for m in _NS_ALIAS.finditer(everything):
        alias, target = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        parts = re.split(r"\s*::\s*", target.lstrip(":"))
        if parts[0] in _ROOTS:
            aliases[alias] = parts
    qualified = re.compile(rf"(?<![\w.])(?<!->)({'|'.join(map(re.escape, aliases))})\s*::\s*(\w+(?:\s*::\s*\w+)*)")
    bare = _USING_NS.search(everything) is not None
    defined: dict[str, bool] = {}
    for label, with_strings, code in sources:
        def where(pos: int, label: str = label, code: str = code) -> tuple[str, str, int]:
            return label, code, pos

        for m in _INCLUDE.finditer(with_strings):
            if _VENDOR_INCLUDE.match(m.group(1)):
                add("native_library_compute", f" ({label})", m.group(1), f"#include <{m.group(1)}> pulls in a vendor "
                    f"math library; {KERNEL_RULE}")
        for m in qualified.finditer(code):
            parts = aliases[m.group(1)] + re.split(r"\s*::\s*", m.group(2))
            found = _native_path(parts[0], parts[1:]) if len(parts) > 1 else None
            if found:
                add(found[0], where(m.start()), "::".join(parts), found[1])
        for m in _METHOD_CALL.finditer(code):
            if m.group(1) in _NATIVE_METHOD_DENY:
                add("native_library_compute", where(m.start()), "." + m.group(1),
                    f".{m.group(1)}() is an ATen tensor compute method; {KERNEL_RULE}")
        if bare:
            for m in re.finditer(r"(?<![\w.:>])(\w+)\s*(?:<[^;(){}]*>)?\s*\(", code):
                if m.group(1) in _BARE_DENY and m.group(1) not in defined:
                    defined[m.group(1)] = _defines(everything, m.group(1))
                if m.group(1) in _BARE_DENY and not defined[m.group(1)]:
                    add("native_library_compute", where(m.start()), m.group(1), f"{m.group(1)}() resolves to an "
                        f"ATen op through `using namespace`; {KERNEL_RULE}")
        for m in _VENDOR.finditer(code):
            token = re.sub(r"\s+", "", m.group(0))
            add("native_library_compute", where(m.start()), token, f"{token} is a vendor library (cuBLAS/cuDNN/"
                f"CUTLASS/BLAS/...) or dynamic loading; {KERNEL_RULE}")
        if "##" in code:
            add("native_library_compute", where(code.index("##")), "##", "token pasting (##) is not allowed: it "
                "hides identifiers (library and ATen calls) from these checks")
        for m in _DISPATCH.finditer(code):
            add("native_library_compute", where(m.start()), m.group(0), f"{m.group(0)} manipulates the PyTorch "
                "dispatcher (bypassing the op checks); not allowed")
        for m in _NATIVE_CONCURRENCY.finditer(code):
            token = re.sub(r"\s+", "", m.group(0)).rstrip("(")
            add("concurrency", where(m.start()), token, f"{token} creates threads, processes or streams; {SYNC_RULE}")
        for m in _NATIVE_UNSAFE.finditer(code):
            token = re.sub(r"\s+", "", m.group(0)).rstrip("(")
            add("unsafe_builtin", where(m.start()), token, f"{token} runs Python code, processes or memory tricks "
                "from native code; not allowed")
    for flag in (*spec.extra_ldflags, *spec.extra_include_paths, *spec.extra_cflags, *spec.extra_cuda_cflags):
        if _VENDOR_FLAG.search(flag):
            add("native_library_compute", "", flag, f"build flag {flag!r} links or includes a vendor math library; "
                f"{KERNEL_RULE}")
    _check_kernel_present(spec, backend, sources, add)
    bad_flags = user_flags.unsafe_flags(spec)
    if bad_flags:  # always on: not a reward rule but the build machine's safety
        out.append(Violation("build_flags", f"extension {spec.name!r}: {user_flags.describe(bad_flags)}"))
    return out


def _check_kernel_present(spec: ExtensionSpec, backend: str, sources: list[tuple[str, str, str]],
                          add: Callable[..., None]) -> None:
    cpp = "\n".join(code for label, _, code in sources if label.startswith("cpp"))
    cuda = "\n".join(code for label, _, code in sources if label.startswith("cuda"))
    if backend == "cuda":
        if not _KERNEL.search(cuda):
            add("no_kernel", "", "global", "defines no __global__ kernel in cuda_sources; write a CUDA kernel")
        elif not _LAUNCH.search(cuda + cpp):
            add("no_kernel", "", "launch", "never launches its kernel (no <<<...>>> or cudaLaunchKernel)")
        return
    if cuda.strip():
        add("no_kernel", "", "cuda", "cpu backend: write C++ (cpp_sources) only, cuda_sources must be empty")
    if not cpp.strip():
        add("no_kernel", "", "empty", "cpu backend: cpp_sources is empty; write the kernel in C++")
    elif spec.functions is None:
        if "PYBIND11_MODULE" not in cpp:
            add("no_kernel", "", "bind", "functions=None but no PYBIND11_MODULE block binds a C++ function")
    elif not any(_defines(cpp, fn) for fn in spec.functions):
        add("no_kernel", "", "define", f"none of the bound functions ({', '.join(spec.functions)}) is defined "
            "in cpp_sources")

