"""The native rules: one ``load_inline`` extension's C++/CUDA sources, checked after comments and string
literals are stripped (ATen/torch library calls, vendor libraries, dispatcher tricks, threads and streams,
calls back into Python, a kernel that is really there), and its build flags."""
from __future__ import annotations

import re
from typing import Callable

from kevin_exp.bench.build import spec_check
from kevin_exp.bench.checks.bounds import extension_too_large
from kevin_exp.bench.checks.deadline import run_checked
from kevin_exp.bench.checks.native_identifiers import (
    ASM_CACHE_POLICY,
    DIRECTIVE,
    DISPATCH,
    NATIVE_CONCURRENCY,
    NATIVE_METHOD_DENY,
    ROOTS,
    check_identifiers,
    using_namespaces,
)
from kevin_exp.bench.checks.rules import (
    KERNEL_RULE,
    SYNC_RULE,
    Violation,
    rule_enabled,
    words,
)
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.native_source import NativeSource, defined_functions, is_word, tokenize
from kevin_exp.bench.spec import ExtensionSpec

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.M)
_NS_ALIAS = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+((?:::)?\w+(?:\s*::\s*\w+)*)[ \t]*$|"
                       r"\bnamespace\s+(\w+)\s*=\s*((?:::)?\w+(?:\s*::\s*\w+)*)\s*;", re.M)
_TEMPLATE_ARGS = r"(?:<[^;(){}]{0,256}>)?"
_METHOD_CALL = re.compile(rf"(?:\.|->)\s*(\w+)\s*{_TEMPLATE_ARGS}\s*\(")
_BARE_CALL = re.compile(rf"(?<![\w.:>])(\w+)\s*{_TEMPLATE_ARGS}\s*\(")
_KERNEL = re.compile(r"\b__global__\b")
_LAUNCH = re.compile(r"<<<|\bcu(?:da)?Launch(?:Cooperative)?Kernel(?:Ex)?\b")
_VENDOR = re.compile(r"\b(?:(?i:cublas|cudnn|cusparse|cusolver|cufft)\w*|cblas_\w+|mkl_\w+|MKL_\w+|dnnl\w*|"
                     r"mkldnn\w*|openblas\w*|[sdcz]gemm_|dlopen|dlsym)\b|\b(?:cutlass|cute|thrust|Eigen)\s*::|"
                     r"\bcub\s*::\s*Device\w*")
_VENDOR_INCLUDE = re.compile(r"(?i)^(?:cublas|cudnn|cusparse|cusolver|cufft|cutlass/|cute/|cblas|mkl|dnnl|mkldnn|"
                             r"oneapi/dnnl|eigen|openblas|ATen/cuda/CUDABlas|ATen/cudnn/|cub/device/)")
_VENDOR_FLAG = re.compile(r"(?i)cublas|cudnn|cusparse|cusolver|cufft|mkl|openblas|blas|dnnl|lapack|cutlass|eigen")
_NATIVE_UNSAFE = re.compile(  # Python C-API / pybind11 calls back into Python, processes, memory tricks
    r"\b(?:Py[A-Z][A-Za-z]*_\w+|Py_\w+|mprotect|ptrace|process_vm_writev)\b|(?:\.|->)\s*attr\s*\(|"
    r"(?<![\w.:>])(?:system|popen|exec[lv]p?e?)\s*\(|"
    r"\b(?:py|pybind11)\s*::\s*(?:module_?\s*::\s*import|exec|eval\w*|globals)\b")
# ATen ops refused when called unqualified (argument-dependent lookup or `using namespace` resolve them to
# at::); C math names (exp, max, ...) are excluded.
_BARE_DENY = words("""matmul mm bmm addmm baddbmm einsum conv1d conv2d conv3d conv_transpose1d conv_transpose2d
    conv_transpose3d linear softmax log_softmax layer_norm batch_norm group_norm instance_norm max_pool1d
    max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool2d relu gelu silu mish hardtanh
    leaky_relu elu selu softplus dropout logsumexp cumsum cumprod argmax argmin topk cat stack sum mean prod var
    std norm where masked_fill index_select gather scatter clamp sigmoid""")


def strip_native(text: str, keep_strings: bool = False) -> str:
    """Source with comments removed and (unless keep_strings) string/char literals emptied; line
    continuations are spliced first, as the preprocessor does."""
    src = tokenize(text)
    return src.with_strings if keep_strings else src.code


# string literals (adjacent ones joined, escapes decoded) that name a path: absolute, or /proc /sys /dev
_PATH_LITERAL = re.compile(r"^/|/(?:proc|sys|dev)(?![^/])")
_ESCAPE = re.compile(r"\\(?:x[0-9A-Fa-f]++|[0-7]{1,3}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_INCLUDE_DENY = re.compile(
    r"(?i)^(?:python\.h|pybind11/|torch/python\.h|torch/csrc/|frameobject\.h|dlfcn\.h|link\.h|spawn\.h|"
    r"sys/syscall\.h|syscall\.h|sys/ptrace\.h|sys/mman\.h|fstream|filesystem|fcntl\.h|sys/fcntl\.h|dirent\.h|"
    r"sys/socket\.h|sys/un\.h|sys/ioctl\.h|sys/inotify\.h|sys/fanotify\.h|sys/mount\.h|sys/auxv\.h|sys/uio\.h|"
    r"sys/personality\.h|sys/time\.h|sys/timex\.h|linux/|asm/|cupti|nvml|nvrtc|nvjitlink|cudatypedefs\.h|"
    r"cudagl|cudaegl|cuda_gl|cuda_egl)")
_INCLUDE_CONCURRENCY = re.compile(r"^(?:thread|future|pthread\.h|threads\.h|stop_token|execution|sys/prctl\.h)$")
_INCLUDE_PATH = re.compile(r"[\w+\-][\w./+\-]{0,200}")
_MAX_REPORTED = 20  # violations per extension (the verdict shows the first five)


def check_native(spec: ExtensionSpec, backend: str, rules: CheckRules) -> list[Violation]:
    """Rules on one extension's C++/CUDA sources, under the static checks' deadline and input bounds (a
    checker process that is killed when it runs over; see ``deadline``)."""
    return run_checked("native", native_violations, (spec, backend, rules), rules)


def native_violations(spec: ExtensionSpec, backend: str, rules: CheckRules) -> list[Violation]:
    """The native rules themselves, in this process and without a deadline (``check_native`` runs them in
    the checker process)."""
    too_large = extension_too_large(spec, rules)
    if too_large is not None:
        return [too_large]
    out: list[Violation] = []
    seen: set[tuple[str, str]] = set()

    def add(rule: str, where: str | tuple[str, str, int], key: str, text: str) -> None:
        """One violation per (rule, token); the line is only worked out for reported ones."""
        if not rule_enabled(rule, rules) or (rule, key) in seen or len(out) >= _MAX_REPORTED:
            return
        seen.add((rule, key))
        if isinstance(where, tuple):
            label, code, pos = where
            where = f" ({label} line {code.count(chr(10), 0, pos) + 1})"
        out.append(Violation(rule, f"extension {spec.name!r}{where}: {text}"))

    parsed: list[tuple[str, NativeSource]] = []
    for kind, texts in (("cpp_sources", spec.cpp_sources), ("cuda_sources", spec.cuda_sources)):
        for i, text in enumerate(texts):
            parsed.append((kind if len(texts) == 1 else f"{kind}[{i}]", tokenize(text)))
    # include lines are judged by their target, once, so they are blanked from the code scan
    sources = [(label, src.with_strings, _INCLUDE.sub(lambda m: " " * len(m.group(0)), src.code))
               for label, src in parsed]
    everything = "\n".join(code for _, _, code in sources)
    aliases: dict[str, list[str]] = {r: [r] for r in ROOTS}
    for m in _NS_ALIAS.finditer(everything):
        alias, target = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        parts = re.split(r"\s*::\s*", target.lstrip(":"))
        if parts[0] in ROOTS:
            aliases[alias] = parts
    defined: set[str] | None = None
    own_namespaces = {src.tokens[i + 1] for _, src in parsed for i in range(len(src.tokens) - 2)
                      if src.tokens[i] == "namespace" and src.tokens[i + 2] == "{"}
    # distinct paths, a few at most (others are refused anyway): each chain head is judged against each
    using = [list(p) for p in dict.fromkeys(tuple(path) for _, src in parsed
                                            for path in using_namespaces(src.tokens, aliases))][:16]
    for (label, with_strings, code), (_, src) in zip(sources, parsed):
        def where(pos: int, label: str = label, code: str = code) -> tuple[str, str, int]:
            return label, code, pos

        _check_includes(label, with_strings, add)
        _check_hiding(src, where, add)
        check_identifiers(src, aliases, own_namespaces, using, where, add)
        _check_path_literals(src, where, add)
        _check_op_watch_names(src, where, add)
        for m in _METHOD_CALL.finditer(code):
            if m.group(1) in NATIVE_METHOD_DENY:
                add("native_library_compute", where(m.start()), "." + m.group(1),
                    f".{m.group(1)}() is an ATen tensor compute method; {KERNEL_RULE}")
        # `matmul(xc, xc)` resolves to at::matmul by argument-dependent lookup (xc is an at::Tensor), with or
        # without `using namespace at`: compute-op names are refused unqualified unless the sources define them
        for m in _BARE_CALL.finditer(code):
            if m.group(1) in _BARE_DENY:
                if defined is None:
                    defined = {fn for _, s in parsed for fn in defined_functions(s.tokens)}
                    defined |= {s.tokens[k] for _, s in parsed for k in range(len(s.tokens) - 2)
                                if s.tokens[k + 1] == "=" and s.tokens[k + 2] != "=" and is_word(s.tokens[k])}
                if m.group(1) not in defined:
                    add("native_library_compute", where(m.start()), m.group(1), f"{m.group(1)}() resolves to an "
                        f"ATen op (argument-dependent lookup on a tensor, or `using namespace`); {KERNEL_RULE}")
        for m in _VENDOR.finditer(code):
            token = re.sub(r"\s+", "", m.group(0))
            add("native_library_compute", where(m.start()), token, f"{token} is a vendor library (cuBLAS/cuDNN/"
                f"CUTLASS/BLAS/...) or dynamic loading; {KERNEL_RULE}")
        if "##" in code:
            add("native_library_compute", where(code.index("##")), "##", "token pasting (##) is not allowed: it "
                "hides identifiers (library and ATen calls) from these checks")
        for m in DISPATCH.finditer(code):
            token = re.sub(r"\s+", "", m.group(0)).rstrip("(")
            add("native_library_compute", where(m.start()), token, f"{token} registers or manipulates PyTorch "
                "dispatcher kernels (bypassing the op checks); not allowed")
        for m in NATIVE_CONCURRENCY.finditer(code):
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
    _check_kernel_present(spec, backend, sources, parsed, add)
    # always on: not reward rules but what reaches the compiler besides the checked sources (names pasted into
    # generated code, flags, include paths) and the build machine's safety
    for problem in spec_check.spec_problems(spec):
        rule = "build_flags" if problem.startswith("build flag") else "build_inputs"
        out.append(Violation(rule, f"extension {spec.name[:80]!r}: {problem}"))
    return out


def _check_includes(label: str, with_strings: str, add: Callable[..., None]) -> None:
    for m in DIRECTIVE.finditer(with_strings):
        directive = m.group(1)
        if directive in ("import", "include_next"):
            add("unsafe_builtin", f" ({label})", m.group(0), f"#{directive} is not allowed; use #include <...>")
        if directive != "include":
            continue
        inc = _INCLUDE.match(m.group(0))
        target = inc.group(1).strip() if inc else ""
        if not inc or "<" not in m.group(0) or not _INCLUDE_PATH.fullmatch(target) or ".." in target:
            add("unsafe_builtin", f" ({label})", m.group(0), f"`{m.group(0).strip()[:80]}`: only #include <header> "
                "of a system, CUDA or torch header is allowed (no quoted, relative, absolute or macro includes)")
        elif _VENDOR_INCLUDE.match(target):
            add("native_library_compute", f" ({label})", target, f"#include <{target}> pulls in a vendor "
                f"math library; {KERNEL_RULE}")
        elif _INCLUDE_CONCURRENCY.match(target):
            add("concurrency", f" ({label})", target, f"#include <{target}> is for threads; {SYNC_RULE}")
        elif _INCLUDE_DENY.match(target):
            add("unsafe_builtin", f" ({label})", target, f"#include <{target}> reaches Python, dynamic loading or "
                "system calls from native code; not allowed")


def _check_hiding(src: NativeSource, where: Callable[[int], tuple[str, str, int]],
                  add: Callable[..., None]) -> None:
    """Constructs that make the compiler see tokens these checks do not."""
    if src.trigraphs:
        add("unsafe_builtin", where(0), "??", "trigraphs (??=, ??/, ...) are not allowed: they can hide "
            "preprocessor directives and line splices from these checks")
    for what, pos in src.hidden:
        add("unsafe_builtin", where(pos), what, f"{what} is not allowed: it can hide code from these checks "
            "(write plain string literals, #include and identifiers)")


def _decode_literal(literal: str) -> str | None:
    """A string literal's value (escapes decoded); None for a character literal."""
    quote = min((i for i in (literal.find('"'), literal.find("'")) if i >= 0), default=-1)
    if quote < 0 or literal[quote] != '"':
        return None
    body = literal[quote + 1:]
    body = body[:-1] if body.endswith('"') else body

    def one(m: re.Match[str]) -> str:
        e = m.group(0)[1:]
        if e[0] in "xuU" and len(e) > 1:
            return chr(min(int(e[1:], 16), 0x10FFFF))
        if e[0] in "01234567":
            return chr(int(e, 8))
        return _SIMPLE_ESCAPES.get(e, e)

    return _ESCAPE.sub(one, body)


def _check_path_literals(src: NativeSource, where: Callable[[int], tuple[str, str, int]],
                         add: Callable[..., None]) -> None:
    """String literals, adjacent ones joined as the compiler joins them, that name a file-system path or an
    L2 cache policy."""
    toks, n = src.tokens, len(src.tokens)
    j = 0
    while j < n:
        if toks[j] != '"' or src.positions[j] not in src.string_at:
            j += 1
            continue
        start, parts = j, []
        while j + 1 < n and toks[j] == '"' and src.positions[j] in src.string_at:
            value = _decode_literal(src.string_at[src.positions[j]])
            if value is None:
                break
            parts.append(value)
            j += 2
        j = max(j, start + 1)
        text = "".join(parts)
        if ASM_CACHE_POLICY.search(text):  # also where a macro carries the asm template
            add("timing_patch", where(src.positions[start]), "asm cache policy", "a string with an L2 cache policy "
                "that keeps lines resident (evict_last, createpolicy, applypriority) would survive the cache flush "
                "between trials; not allowed")
        if _PATH_LITERAL.search(text):
            shown = text[:60].encode("unicode_escape").decode()
            add("unsafe_builtin", where(src.positions[start]), "path " + shown, f"the string \"{shown}\" names a "
                "file-system path (absolute, /proc, /sys or /dev); native code may not reach files")


def _check_kernel_present(spec: ExtensionSpec, backend: str, sources: list[tuple[str, str, str]],
                          parsed: list[tuple[str, NativeSource]], add: Callable[..., None]) -> None:
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
        add("no_kernel", "", "bind", "functions=None: name the functions to bind with load_inline(..., "
            "functions=[...]) (writing PYBIND11_MODULE yourself is not allowed)")
    else:
        defined = {fn for label, src in parsed if label.startswith("cpp") for fn in defined_functions(src.tokens)}
        if not defined.intersection(spec.functions):
            add("no_kernel", "", "define", f"none of the bound functions ({', '.join(spec.functions)}) is defined "
                "in cpp_sources")


# The op guard's watch on other threads is a RecordFunction callback, switched off per thread by these (and the
# thread-local state they live in): refused wherever they appear. Defence in depth: the watch is also verified
# on every intra-op thread after each call (runtime_guard, build/op_watch.py).
# names that change the profiler's record functions (substring tests, linear on any token)
_OP_WATCH_PARTS = ("RecordFunction", "record_function", "ThreadLocalState", "StepCallbacks", "CallbackHandle",
                   "ObserverContext")
_OP_WATCH_PREFIXES = ("RECORD_FUNCTION", "RECORD_USER_SCOPE", "RECORD_EDGE_SCOPE", "RECORD_OUTPUTS", "RECORD_TORCHSCRIPT")
_OP_WATCH_EXACT = frozenset({"ThreadLocalDebugInfo", "DebugInfoGuard", "RecordScope"})


def _changes_op_watch(word: str) -> bool:
    return (word in _OP_WATCH_EXACT or word.startswith(_OP_WATCH_PREFIXES) or any(p in word for p in _OP_WATCH_PARTS)
            or (word.startswith(("add", "remove", "disable", "reenable")) and word.endswith(("Callback", "Callbacks")))
            or (word.startswith("clear") and word.endswith("Callbacks")))


def _check_op_watch_names(src: NativeSource, where: Callable[[int], tuple[str, str, int]],
                          add: Callable[..., None]) -> None:
    for i, word in enumerate(src.tokens):
        if is_word(word) and _changes_op_watch(word):
            add("native_library_compute", where(src.positions[i]), word, f"{word} changes the profiler's record "
                f"functions, through which ATen ops on every thread are watched; {KERNEL_RULE}")
