"""The native rules' pass over identifiers (``native.native_violations`` runs it on each source): names refused
wherever they appear (Python objects from C++, dynamic loading, processes, files, memory tricks, CUDA calls that
reach past the timer or change what it relies on), qualified ATen/torch names (also through namespace aliases
and ``using namespace``), and inline assembly (system calls, asm labels, L2 cache policies)."""
from __future__ import annotations

import bisect
import re
from typing import Callable

from kevin_exp.bench.checks.rules import KERNEL_RULE, SYNC_RULE, TENSOR_COMPUTE_METHODS, words
from kevin_exp.bench.native_source import NativeSource, is_word

ROOTS = ("at", "aten", "torch", "c10", "caffe2")
DISPATCH = re.compile(r"\b(?:DispatchKey\w*|\w*DispatchKeyGuard|AutoDispatch\w+|\w*LocalDispatchKeySet|Dispatcher|"
                      r"OperatorHandle|redispatch|TORCH_LIBRARY\w*|PythonTLSSnapshot|ThreadLocalStateGuard|RegisterOperators|"
                      r"C10_REGISTER\w*|REGISTER_DISPATCH|TORCH_REGISTER\w*)\b|(?:\.|->)\s*(?:impl|fallback)\s*\(")
NATIVE_CONCURRENCY = re.compile(
    r"\b(?:cudaStreamCreate\w*|cuStreamCreate\w*|pthread_create|getStreamFromPool|getStreamFromExternal|"
    r"setCurrentCUDAStream|\w*CUDAStreamGuard|CUDAMultiStreamGuard|cudaLaunchHostFunc|cuLaunchHostFunc|"
    r"cudaStreamAddCallback)\b|\bstd\s*::\s*(?:thread|jthread|async)\b|(?<![\w.:>])v?fork\s*\(")
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
NATIVE_METHOD_DENY = TENSOR_COMPUTE_METHODS - words("any all numpy apply_ map_ map2_")


def _native_path(root: str, parts: list[str]) -> tuple[str, str] | None:
    path = "::".join(parts)
    name = f"{root}::{path}"
    if any(NATIVE_CONCURRENCY.fullmatch(p) for p in parts):
        return None  # reported by the concurrency scan
    if any(DISPATCH.fullmatch(p) for p in parts) or parts[0] in ("impl", "_ops"):
        return "native_library_compute", f"{name} reaches into the dispatcher (bypassing the op checks); not allowed"
    if root in ("c10", "caffe2"):
        return None
    if parts[0] in ("Tensor", "TensorBase"):
        if len(parts) > 1 and parts[1] in NATIVE_METHOD_DENY:
            return "native_library_compute", f"{name} is an ATen compute op; {KERNEL_RULE}"
        return None
    if parts[0] in NATIVE_ALLOWED or re.fullmatch(r"k[A-Z]\w*", parts[0]) or any(
            path == p or path.startswith(p + "::") for p in NATIVE_ALLOWED_PATHS):
        return None
    return "native_library_compute", (f"{name} is an ATen/torch library call (only allocation, tensor "
                                      f"metadata and stream/guard helpers are allowed); {KERNEL_RULE}")


# Identifiers that are refused wherever they appear (also in a #define body, so a macro cannot rename them:
# without ## no new identifier can be made). Python objects from C++ (pybind11, the CPython API, torch's
# Python bindings), dynamic loading, processes and memory tricks: rule unsafe_builtin.
_PY_IDENT = re.compile(r"(?:Py[A-Z_]|_Py|THP|PYBIND11_|PYTHON_)\w*+|pybind11\b")
_PY_INFIX = ("PyObject", "PyInterpreter")  # SafePyObject, c10::impl::PyInterpreter, ...
_UNSAFE_IDENTS = words("""module_ reinterpret_borrow reinterpret_steal gil_scoped_acquire gil_scoped_release
    eval_file exec eval globals dlopen dlmopen dlsym dlvsym system popen execl execlp execle execv execvp execvpe execve fexecve
    execveat    syscall ptrace mprotect process_vm_writev process_vm_readv""")
# Rewriting code or memory in place (libc's clock_gettime made to run slow), finding libraries' code, and
# system-level process state: no kernel needs them.
_MEMORY_IDENTS = words("""pkey_mprotect pkey_alloc pkey_free pkey_set pkey_get mmap mmap64 munmap mremap madvise
    posix_madvise mlock mlock2 munlock mlockall munlockall remap_file_pages memfd_create memfd_secret userfaultfd
    PROT_EXEC PROT_WRITE MAP_FIXED arch_prctl personality seccomp perf_event_open dl_iterate_phdr getauxval dladdr
    dlinfo _r_debug link_map dl_sym dl_vsym dl_open dlopen_mode""")
# Files: an honest kernel never opens one (and /proc/self/mem is writable code).
_FILE_IDENTS = words("""open open64 openat openat64 openat2 creat creat64 fopen fopen64 freopen freopen64 fdopen
    opendir fdopendir scandir open_by_handle_at name_to_handle_at shm_open sem_open mq_open mkfifo mkfifoat mknod
    mknodat mkstemp mkstemps mkostemp mkostemps mkdtemp tmpnam tempnam chdir fchdir chroot mount umount umount2
    pivot_root unlink unlinkat rename renameat renameat2 symlink symlinkat linkat readlink readlinkat realpath
    truncate truncate64 socket socketpair ioctl inotify_init inotify_init1 inotify_add_watch fanotify_init
    fanotify_mark ifstream ofstream fstream filebuf basic_ifstream basic_ofstream basic_fstream basic_filebuf
    wifstream wofstream wfstream filesystem""")
_LIBC_OPEN = re.compile(r"_{1,2}(?:libc_)?(?:open|openat|fopen|creat)\w*+|_IO_\w++")  # __open_2, _IO_new_fopen, ...
# libc's internal aliases of the names above (`__mmap`, `__libc_dlsym`, `__prctl`) are judged by the name
_LIBC_ALIASED = _MEMORY_IDENTS | _FILE_IDENTS | words("""mprotect ptrace syscall dlopen dlmopen dlsym dlvsym system
    popen execve execveat process_vm_writev process_vm_readv""")
_CONCURRENCY_IDENTS = words("fork vfork pthread_create thrd_create posix_spawn posix_spawnp clone3 prctl")
# CUDA runtime/driver API an honest single-kernel candidate never needs, by what it would be used for:
# functions fetched by name (like dlsym: the name is a string, hidden from these checks) and code loaded
# from text, ...
_CUDA_BY_NAME = re.compile(r"cu(?:da)?GetDriverEntryPoint\w*+|cuGetProcAddress\w*+|cu(?:da)?GetExportTable\w*+|"
                           r"PFN_\w++|cu(?:da)?Library\w*+|cuModule\w*+|cuLink\w*+|nvrtc\w*+|nvJitLink\w*+")
# ... another device, context, process or host memory (work or data the timer does not see), ...
_CUDA_ELSEWHERE = re.compile(
    r"cudaSetDevice\w*+|cudaSetValidDevices|cudaDeviceReset|cudaThreadExit|cuDevicePrimaryCtx\w*+|"
    r"cuCtx(?:Create|Destroy|SetCurrent|PushCurrent|PopCurrent|SetFlags|EnablePeerAccess)\w*+|"
    r"cu(?:da)?DeviceEnablePeerAccess|cu(?:da)?Memcpy(?:3D)?Peer\w*+|cu(?:da)?Ipc\w*+|CUipc\w*+|"
    r"cu(?:da)?MallocHost|cu(?:da)?HostAlloc\w*+|cu(?:da)?HostRegister\w*+|cu(?:da)?HostGetDevicePointer\w*+|"
    r"cuMem(?:AllocHost|HostAlloc|HostRegister|HostGetDevicePointer|AllocManaged)\w*+|cudaMallocManaged|"
    r"cu(?:da)?(?:Import|Destroy)External\w*+|cu(?:da)?(?:Signal|Wait)External\w*+|cudaExternal\w*+|"
    r"CUexternal\w*+|cuMem(?:Export|Import)\w*+|cu(?:da)?LaunchCooperativeKernelMultiDevice|"
    r"cu(?:da)?GreenCtx\w*+|CUgreenCtx\w*+|cudaExecutionCtx\w*+|cu(?:da)?DevResource\w*+|cuDevSmResource\w*+")
# ... work outside the current stream (graphs, capture, host callbacks, the default streams' handles, launch
# attributes, which can carry another stream or an overlapping launch as plain numbers), ...
_CUDA_CONCURRENCY = re.compile(
    r"cu(?:da)?Graph\w*+|CUgraph\w*+|cu(?:da)?Stream(?:BeginCapture|EndCapture|IsCapturing|GetCaptureInfo|"
    r"UpdateCaptureDependencies|SetAttribute|CopyAttributes|AddCallback|AttachMemAsync|WaitValue|WriteValue|"
    r"BatchMemOp)\w*+|cu(?:da)?ThreadExchangeStreamCaptureMode|cu(?:da)?LaunchHostFunc|cudaStreamPerThread|"
    r"cudaStreamLegacy|CU_STREAM_(?:PER_THREAD|LEGACY)|cu(?:da)?LaunchKernelEx\w*+|cudaLaunchAttribute\w*+|"
    r"CUlaunchAttribute\w*+|CU_LAUNCH_ATTRIBUTE\w*+|cudaLaunchConfig\w*+|CUlaunchConfig\w*+|cu(?:da)?UserObject\w*+")
_CUDA_CONCURRENCY_INFIX = ("Programmatic", "PROGRAMMATIC")
# ... and state the timer relies on: L2 persistence survives the cache flush between trials, device limits,
# profiler callbacks (CUPTI), clocks (NVML), thread counts the reference runs with, the system clock.
_TIMING = re.compile(r"cu(?:da)?DeviceSetLimit|cuCtxSetLimit|cudaThreadSetLimit|cu(?:da)?CtxResetPersistingL2Cache|"
                     r"cudaDeviceSet(?:CacheConfig|SharedMemConfig)|cuCtxSet(?:CacheConfig|SharedMemConfig)|"
                     r"(?i:cupti)\w*+|nvml\w*+|omp_set_\w++|clock_settime|settimeofday|adjtimex|clock_adjtime")
_TIMING_INFIX = ("AccessPolicyWindow", "accessPolicyWindow", "ACCESS_POLICY_WINDOW", "PersistingL2", "PERSISTING_L2",
                 "AccessProperty", "ACCESS_PROPERTY", "access_property", "annotated_ptr")
# PTX cache policies that keep lines in L2 past the flush between trials (evict_last, createpolicy, ...)
ASM_CACHE_POLICY = re.compile(r"(?i)evict_last|evict_unchanged|createpolicy|applypriority")
# ATen names that change how the reference runs (TF32, cuDNN benchmark, thread counts, allocators, hooks):
# refused also unqualified (after `using namespace at`, or as methods of the context), whatever precedes them.
_ATEN_DISTINCTIVE = words("""globalContext getCUDAHooks getCPUAllocator SetCPUAllocator SetAllocator
    getCUDADeviceAllocator set_num_threads set_num_interop_threads init_num_threads getCurrentCUDABlasHandle
    getCurrentCUDABlasLtHandle getCurrentCUDASolverDnHandle getCurrentCUDASparseHandle""")
_CONTEXT_SETTER = re.compile(r"set(?:Allow|Float32|Benchmark|Deterministic|UserEnabled|SDP|Flush|Linalg|Blas|"
                             r"QEngine|DisplayVmap|CheckSparse|ROCm|DefaultMobileCPU)\w*+")
# sub-namespaces of at/torch/c10 that `using namespace` may bring in (others bring ATen internals unqualified)
_USING_SUB_OK = words("cuda indexing")
# heads of qualified names that resolve into ATen after `using namespace at` (judged as at::head::...)
_ATEN_SUBNAMESPACES = words("""native detail _ops impl nn functional autograd jit cuda blas cpu meta functorch ops
    library autocast profiler utils sparse fft linalg special nested api data optim serialize internal vec
    xpu mps hip cudnn miopen mkldnn""")
_ASM = words("asm __asm__ __asm")
_ASM_TRAP = re.compile(r"(?i)\b(?:syscall|sysenter|svc)\b|\bint\s*\$?0x80\b")
# `int f(const char*) asm("system");` binds a declaration to any symbol: an asm template that is only a name
_ASM_LABEL = re.compile(r"[A-Za-z_.$][\w.$@]*+")
_ASM_QUALIFIERS = words("volatile __volatile__ goto inline")
# `__attribute__((weakref("system")))` and friends do the same
_SYMBOL_ATTRS = words("weakref __weakref__ alias __alias__ ifunc __ifunc__ symver __symver__")
# namespaces a `using namespace` / `namespace A = B` may name (besides the sources' own namespaces)
_NAMESPACES_OK = words("std at torch c10 cooperative_groups cg nvcuda wmma cuda cub")
DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(\w*)[^\n]*", re.M)


def using_namespaces(toks: list[str], aliases: dict[str, list[str]]) -> list[list[str]]:
    """The ATen paths that `using namespace X[::Y...]` brings into scope (X an ATen root or an alias of one)."""
    out = []
    for i in range(len(toks) - 2):
        if toks[i] == "using" and toks[i + 1] == "namespace":
            j = i + 2 + (toks[i + 2] == "::")
            if j < len(toks) and toks[j] in aliases:
                path = list(aliases[toks[j]])
                while j + 2 < len(toks) and toks[j + 1] == "::" and is_word(toks[j + 2]):
                    path.append(toks[j + 2])
                    j += 2
                out.append(path)
    return out


def check_identifiers(src: NativeSource, aliases: dict[str, list[str]], own_namespaces: set[str],
                      using: list[list[str]], where: Callable[[int], tuple[str, str, int]],
                      add: Callable[..., None]) -> None:
    """One pass over the identifier tokens: qualified ATen/torch names (also through `using namespace`),
    banned identifiers, namespace aliases and `using namespace`, `py::`, and namespace roots used other than
    as `root::`."""
    toks = src.tokens
    n = len(toks)
    directives = _Directives(src.code)
    chain_end = -1  # tokens up to here belong to a qualified name already judged
    for i, word in enumerate(toks):
        at = src.positions[i]
        if not is_word(word):
            if word == "::" and i and toks[i - 1] == ")" and not _decltype_before(toks, i - 1):
                add("unsafe_builtin", where(at), ")::", "`(...)::` qualifies a name through a macro argument; "
                    "write namespaces out (`at::`, `std::`)")
            continue
        prev = toks[i - 1] if i else ""
        nxt = toks[i + 1] if i + 1 < n else ""
        if word in _ASM:
            _check_asm(src, i, where, add)
        if word in ("using", "namespace") and directives.at(at) == "define":
            add("unsafe_builtin", where(at), "define " + word, f"`{word}` inside a #define is not allowed (it hides "
                "which namespace is brought in)")
        if word in _SYMBOL_ATTRS and (prev == "(" or prev == "::"):
            add("unsafe_builtin", where(at), word, f"the {word} attribute binds a declaration to another symbol; "
                "not allowed")
        if _PY_IDENT.fullmatch(word) or word in _UNSAFE_IDENTS or any(p in word for p in _PY_INFIX):
            add("unsafe_builtin", where(at), word, f"{word} reaches Python objects, dynamic loading, processes "
                "or memory tricks from native code; not allowed (bind functions with load_inline(functions=[...]))")
        elif word[0] == "_" and _libc_core(word) in _CONCURRENCY_IDENTS:
            add("concurrency", where(at), word, f"{word} creates or controls threads or processes; {SYNC_RULE}")
        elif word[0] == "_" and _libc_core(word) in _LIBC_ALIASED:
            add("unsafe_builtin", where(at), word, f"{word} is libc's internal name of {_libc_core(word)}; not allowed")
        elif word in _MEMORY_IDENTS:
            add("unsafe_builtin", where(at), word, f"{word} changes memory protection or mappings, or finds "
                "libraries' code (rewriting code in place, e.g. the clock); not allowed")
        elif word in _FILE_IDENTS or _LIBC_OPEN.fullmatch(word):
            add("unsafe_builtin", where(at), word, f"{word} opens or manipulates files, sockets or devices; native "
                "code may not reach files")
        elif word in _CONCURRENCY_IDENTS:
            add("concurrency", where(at), word, f"{word} creates or controls threads or processes; {SYNC_RULE}")
        elif _CUDA_BY_NAME.fullmatch(word):
            add("unsafe_builtin", where(at), word, f"{word} fetches or loads driver/runtime code by name (like dlsym, "
                "it hides the call from these checks); not allowed")
        elif _CUDA_ELSEWHERE.fullmatch(word):
            add("unsafe_builtin", where(at), word, f"{word} reaches another device, context, process or mapped host "
                "memory (work the timer does not see); not allowed")
        elif _CUDA_CONCURRENCY.fullmatch(word) or any(p in word for p in _CUDA_CONCURRENCY_INFIX):
            add("concurrency", where(at), word, f"{word} runs work outside the current stream (graphs, capture, "
                f"host callbacks, other streams, launch attributes); {SYNC_RULE}")
        elif _TIMING.fullmatch(word) or any(p in word for p in _TIMING_INFIX):
            add("timing_patch", where(at), word, f"{word} changes state the timer relies on (L2 persistence across "
                "the cache flush, device limits, profiler callbacks, clocks, thread counts); not allowed")
        elif _CONTEXT_SETTER.fullmatch(word) or (word in _ATEN_DISTINCTIVE and prev not in (".", "->")
                                                  and i > chain_end):
            add("native_library_compute", where(at), word, f"{word} changes how ATen (and the reference) runs: "
                f"global context, thread counts, allocators, library handles; {KERNEL_RULE}")
        elif word == "py" and (nxt == "::" or prev == "namespace" or (prev == "=" and i >= 3 and toks[i - 3] == "namespace")
                               or directives.at(at) == "define"):
            add("unsafe_builtin", where(at), "py::", "py:: (pybind11) manipulates Python objects from native "
                "code; not allowed (bind functions with load_inline(functions=[...]))")
        if word == "namespace" and prev == "using":
            head = toks[i + 2] if nxt == "::" and i + 2 < n else nxt
            if head not in _NAMESPACES_OK and head not in own_namespaces:
                add("unsafe_builtin", where(at), f"using namespace {head}", f"`using namespace {head}` is not allowed "
                    f"(only {', '.join(sorted(_NAMESPACES_OK))} or the sources' own namespaces)")
            elif head in aliases:
                k = i + 1 + (nxt == "::")
                path = list(aliases[head])
                while k + 2 < n and toks[k + 1] == "::" and is_word(toks[k + 2]):
                    path.append(toks[k + 2])
                    k += 2
                if len(path) > 2 or (len(path) == 2 and path[1] not in _USING_SUB_OK):
                    name = "::".join(path)
                    add("native_library_compute", where(at), f"using namespace {name}", f"`using namespace {name}` "
                        f"brings ATen internals into scope unqualified (only {', '.join(sorted(_USING_SUB_OK))} "
                        f"below at/torch/c10); {KERNEL_RULE}")
        if word == "namespace" and i + 3 < n and toks[i + 2] == "=":
            target = toks[i + 3] if toks[i + 3] != "::" else (toks[i + 4] if i + 4 < n else "")
            if target not in _NAMESPACES_OK and target not in own_namespaces:
                add("unsafe_builtin", where(at), f"namespace = {target}", f"namespace alias of {target} is not "
                    f"allowed (only {', '.join(sorted(_NAMESPACES_OK))})")
        via_using = (using and nxt == "::" and word in _ATEN_SUBNAMESPACES and word not in own_namespaces
                     and word not in aliases and prev not in (".", "->") and i > chain_end
                     and (prev != "::" or i < 2 or not (is_word(toks[i - 2]) or toks[i - 2] == ">")))
        if via_using:  # `native::mm` after `using namespace at` is at::native::mm
            rest, j = [word], i + 1
            while j + 1 < n and toks[j] == "::" and is_word(toks[j + 1]):
                rest.append(toks[j + 1])
                j += 2
            for path in (p for p in using if p[-1] != word):  # (at::cuda::cuda is not meant)
                found = _native_path(path[0], [*path[1:], *rest])
                if found:
                    add(found[0], where(at), "::".join([*path, *rest]), found[1] + " (through `using namespace`)")
                    break
            chain_end = j - 1
        elif word in aliases and prev not in (".", "->") and i > chain_end:
            if nxt == "::":
                parts, j = list(aliases[word]), i + 1
                while j + 1 < n and toks[j] == "::" and is_word(toks[j + 1]):
                    parts.append(toks[j + 1])
                    j += 2
                chain_end = j - 1
                found = _native_path(parts[0], parts[1:]) if len(parts) > 1 else None
                if found:
                    add(found[0], where(at), "::".join(parts), found[1])
            elif word in ROOTS and prev != "::" and directives.at(at) != "include" \
                    and not _alias_form(src, i, directives):
                add("native_library_compute", where(at), f"{word} (bare)", f"`{word}` is used other than as "
                    f"`{word}::name` (a macro argument or alias can hide an ATen call); {KERNEL_RULE}")


def _libc_core(word: str) -> str:
    """`__libc_mmap` -> `mmap`: the name an internal libc alias stands for."""
    core = word.lstrip("_")
    return core[5:] if core.startswith("libc_") else core


def _check_asm(src: NativeSource, i: int, where: Callable[[int], tuple[str, str, int]],
               add: Callable[..., None]) -> None:
    """The template of the asm statement or label starting at token ``i``: no system calls, no bare symbol
    names (asm labels)."""
    toks, n = src.tokens, len(src.tokens)
    j = i + 1
    while j < n and toks[j] in _ASM_QUALIFIERS:
        j += 1
    if j >= n or toks[j] != "(":
        return
    j += 1
    template = []
    while j + 1 < n and toks[j] == '"' and src.positions[j] in src.string_at:
        literal = src.string_at[src.positions[j]]
        template.append(literal[literal.index('"') + 1:].rstrip('"'))
        j += 2
    text = "".join(template)
    if _ASM_TRAP.search(text):
        add("unsafe_builtin", where(src.positions[i]), "asm syscall", "inline assembly that makes system calls "
            "is not allowed")
    elif ASM_CACHE_POLICY.search(text):
        add("timing_patch", where(src.positions[i]), "asm cache policy", "inline assembly with an L2 cache policy "
            "that keeps lines resident (evict_last, createpolicy, applypriority) would survive the cache flush "
            "between trials; not allowed")
    elif template and _ASM_LABEL.fullmatch(text.strip()) and j < n and toks[j] == ")":
        add("unsafe_builtin", where(src.positions[i]), "asm label", f"asm(\"{text.strip()}\") names a symbol (an "
            "asm label binds a declaration to any function); not allowed")


def _decltype_before(toks: list[str], close: int) -> bool:
    depth = 0
    for j in range(close, max(close - 512, -1), -1):
        depth += {")": 1, "(": -1}.get(toks[j], 0)
        if depth == 0:
            return j > 0 and toks[j - 1] == "decltype"
    return False


def _alias_form(src: NativeSource, i: int, directives: _Directives) -> bool:
    """`using namespace at;`, `namespace A = at;`, `#define NS at`: read as aliases elsewhere."""
    before = src.tokens[max(i - 3, 0):i]
    return before[-2:] == ["using", "namespace"] or (len(before) == 3 and before[0] == "namespace" and before[2] == "=") \
        or (len(before) >= 2 and before[-2] == "define" and directives.at(src.positions[i]) == "define")


class _Directives:
    """Which preprocessor directive (if any) a position of the code is on: found once, looked up by bisection."""

    def __init__(self, code: str) -> None:
        found = [(m.start(), m.end(), m.group(1)) for m in DIRECTIVE.finditer(code)]
        self.starts = [f[0] for f in found]
        self.found = found

    def at(self, pos: int) -> str | None:
        i = bisect.bisect_right(self.starts, pos) - 1
        if i >= 0 and self.found[i][0] <= pos < self.found[i][1]:
            return self.found[i][2]
        return None
