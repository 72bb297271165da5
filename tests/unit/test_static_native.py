"""Native rules on what the compiler will see (bench/checks/native.py, bench/native_source.py): Python objects,
processes, dispatcher registration and the preprocessor tricks that hide them are refused; honest twins pass."""
from __future__ import annotations

import dataclasses

import pytest

from kevin_exp.bench.checks.native import check_native, strip_native
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

RULES = CheckRules()
SWITCH = {"unsafe_builtin": "restrict_imports", "native_library_compute": "no_native_library_compute",
          "concurrency": "no_concurrency", "no_kernel": "require_kernel", "timing_patch": "no_timing_patch"}

CPP = """
#include <torch/extension.h>
#include <vector>
// EXTRA_TOP
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    // EXTRA_BODY
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""


def spec(top: str = "", body: str = "", functions: tuple[str, ...] | None = ("relu_forward",)) -> ExtensionSpec:
    text = CPP.replace("// EXTRA_TOP", top).replace("// EXTRA_BODY", body)
    return ExtensionSpec(name="e", cpp_sources=(text,), functions=functions)


def rules_of(s: ExtensionSpec, rules: CheckRules = RULES) -> set[str]:
    return {v.rule for v in check_native(s, "cpu", rules)}


ATTACKS = [
    # (name, top, body, rule)
    ("namespace alias of pybind11", "namespace py2 = pybind11;", "", "unsafe_builtin"),
    ("using namespace pybind11", "using namespace pybind11;", "", "unsafe_builtin"),
    ("using pybind11::object", "using pybind11::object;", "", "unsafe_builtin"),
    ("PYBIND11_MODULE", "PYBIND11_MODULE(m2, mod) { }", "", "unsafe_builtin"),
    ("py::module_::import", "", 'auto os = py::module_::import("os");', "unsafe_builtin"),
    ("py::eval", "", 'py::eval("1");', "unsafe_builtin"),
    ("py::exec", "", 'py::exec("1");', "unsafe_builtin"),
    ("py through a define", "#define P py", 'P::exec("1");', "unsafe_builtin"),
    ("py through a macro argument", "#define ID(a) a", 'ID(py)::exec("1");', "unsafe_builtin"),
    ("Python.h", "#include <Python.h>", "", "unsafe_builtin"),
    ("PyObject", "", "PyObject* o = nullptr;", "unsafe_builtin"),
    ("PyRun", "", 'PyRun_SimpleString("import os");', "unsafe_builtin"),
    ("PyImport", "", 'PyImport_ImportModule("os");', "unsafe_builtin"),
    ("PyEval", "", "PyEval_GetGlobals();", "unsafe_builtin"),
    ("_Py internals", "", "_PyThreadState_UncheckedGet();", "unsafe_builtin"),
    ("THP bindings", "", "THPVariable_Wrap(xc);", "unsafe_builtin"),
    ("dlopen", "#include <dlfcn.h>", 'void* h = dlopen("libc.so.6", 2);', "unsafe_builtin"),
    ("dlsym", "", 'void* f = dlsym(nullptr, "system");', "unsafe_builtin"),
    ("system", "#include <cstdlib>", 'system("id");', "unsafe_builtin"),
    ("system renamed by a define", "#define RUN system", 'RUN("id");', "unsafe_builtin"),
    ("popen", "", 'popen("id", "r");', "unsafe_builtin"),
    ("execv", "", "execv(nullptr, nullptr);", "unsafe_builtin"),
    ("fork", "", "fork();", "concurrency"),
    ("pthread_create", "", "pthread_create(nullptr, nullptr, nullptr, nullptr);", "concurrency"),
    ("std::thread", "", "std::thread t([]{}); t.join();", "concurrency"),
    ("std::async", "", "auto f = std::async([]{ return 1; });", "concurrency"),
    ("thread header", "#include <thread>", "", "concurrency"),
    ("inline asm syscall", "", 'asm volatile("syscall");', "unsafe_builtin"),
    ("syscall()", "", "syscall(39);", "unsafe_builtin"),
    ("asm label", 'extern "C" int run(const char*) asm("sys" "tem");', "", "unsafe_builtin"),
    ("asm label, one string", 'extern "C" int run(const char*) __asm__("getpid");', "", "unsafe_builtin"),
    ("weakref attribute", 'static int run(const char*) __attribute__((weakref("getpid")));', "", "unsafe_builtin"),
    ("using namespace in a define", "#define U using namespace\nU py;", "", "unsafe_builtin"),
    ("unqualified exec", "", 'exec("import os");', "unsafe_builtin"),
    ("TORCH_LIBRARY", 'TORCH_LIBRARY(myops, m) { m.def("f(Tensor x) -> Tensor"); }', "", "native_library_compute"),
    ("TORCH_LIBRARY_IMPL", "TORCH_LIBRARY_IMPL(aten, CPU, m) { }", "", "native_library_compute"),
    ("TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_FRAGMENT(aten, m) { }", "", "native_library_compute"),
    ("torch::Library", "", "torch::Library* lib = nullptr;", "native_library_compute"),
    ("m.impl", "", 'auto& lib = *reinterpret_cast<int*>(0); lib.impl("mm", 0);', "native_library_compute"),
    ("c10::Dispatcher", "", "auto& d = c10::Dispatcher::singleton();", "native_library_compute"),
    ("RegisterOperators", "", "static int r = RegisterOperators();", "native_library_compute"),
    ("ATen call through a macro argument", "#define ID(a) a", "out = ID(at)::matmul(xc, xc);", "native_library_compute"),
    ("ATen root as a macro argument", "#define Q(ns, f) ns::f", "out = Q(at, matmul)(xc, xc);", "native_library_compute"),
    # preprocessor and lexer tricks
    ("token pasting", "#define CAT(a, b) a##b", "", "native_library_compute"),
    ("digraph #", "%:define X 1", "", "unsafe_builtin"),
    ("digraph ##", "#define CAT(a, b) a %:%: b", "", "unsafe_builtin"),
    ("trigraph", "??=define X 1", "", "unsafe_builtin"),
    ("raw string", "", 'const char* s = R"x(hidden)x";', "unsafe_builtin"),
    ("digit separators around a call", "", 'int a = 1\'0; system("id"); int b = 2\'0;', "unsafe_builtin"),
    ("identifier ending in R before a quote", "#define FOOR", 'FOOR"(" ; system("id"); //)";', "unsafe_builtin"),
    ("wide char literal with a quote", "", 'wchar_t c = L\'"\'; system("id"); //";', "unsafe_builtin"),
    ("line splice inside a name", "", 'sys\\\ntem("id");', "unsafe_builtin"),
    ("quoted include", '#include "/etc/passwd"', "", "unsafe_builtin"),
    ("relative include", "#include <../../etc/passwd>", "", "unsafe_builtin"),
    ("macro include", "#define H <cstdio>\n#include H", "", "unsafe_builtin"),
    ("include_next", "#include_next <cstdio>", "", "unsafe_builtin"),
    ("torch Python header", "#include <torch/csrc/autograd/python_variable.h>", "", "unsafe_builtin"),
    ("using namespace of another library", "using namespace c10d;", "", "unsafe_builtin"),
    ("using namespace of another library, from the global scope", "using namespace ::c10d;", "", "unsafe_builtin"),
    # CUDA driver/runtime functions fetched by name (like dlsym) or code loaded from text
    ("cudaGetDriverEntryPoint", "", 'void* fn = nullptr; cudaGetDriverEntryPoint("cuStreamCreate", &fn, 0);',
     "unsafe_builtin"),
    ("cudaGetDriverEntryPointByVersion", "", 'void* fn; cudaGetDriverEntryPointByVersion("cuStreamCreate", &fn, 12000, 0);',
     "unsafe_builtin"),
    ("cuGetProcAddress_v2", "", 'void* fn; cuGetProcAddress_v2("cuStreamCreate", &fn, 12000, 0, nullptr);',
     "unsafe_builtin"),
    ("PFN typedef", "", "PFN_cuStreamCreate create = nullptr; (void)create;", "unsafe_builtin"),
    ("export table", "", "const void* t; cudaGetExportTable(&t, nullptr);", "unsafe_builtin"),
    ("module loaded from text", "", 'CUmodule m; cuModuleLoadData(&m, "ptx");', "unsafe_builtin"),
    ("runtime compilation", "", "nvrtcProgram p; nvrtcCompileProgram(p, 0, nullptr);", "unsafe_builtin"),
    # work outside the current stream
    ("stream capture", "", "cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal);", "concurrency"),
    ("graph launch", "", "cudaGraphExec_t g; cudaGraphLaunch(g, 0);", "concurrency"),
    ("driver graph", "", "CUgraph g; cuGraphCreate(&g, 0);", "concurrency"),
    ("stream callback", "", "cudaStreamAddCallback(0, nullptr, nullptr, 0);", "concurrency"),
    ("host function", "", "cudaLaunchHostFunc(0, nullptr, nullptr);", "concurrency"),
    ("per-thread default stream", "", "cudaStream_t s = cudaStreamPerThread; (void)s;", "concurrency"),
    ("legacy default stream", "", "cudaStream_t s = cudaStreamLegacy; (void)s;", "concurrency"),
    ("stream attribute", "", "cudaStreamSetAttribute(0, cudaStreamAttributeAccessPolicyWindow, nullptr);", "concurrency"),
    ("launch with attributes", "", "cudaLaunchConfig_t c = {}; cudaLaunchKernelEx(&c, nullptr);", "concurrency"),
    ("programmatic launch", "", "int a = cudaLaunchAttributeProgrammaticStreamSerialization; (void)a;", "concurrency"),
    # state the timer relies on
    ("persisting L2 limit", "", "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20);", "timing_patch"),
    ("persisting L2 reset", "", "cudaCtxResetPersistingL2Cache();", "timing_patch"),
    ("access policy window", "", "cudaAccessPolicyWindow w = {}; (void)w;", "timing_patch"),
    ("device limit", "", "cudaDeviceSetLimit(cudaLimitStackSize, 1 << 16);", "timing_patch"),
    ("CUPTI", "", "cuptiSubscribe(nullptr, nullptr, nullptr);", "timing_patch"),
    ("NVML clocks", "", "nvmlDeviceSetGpuLockedClocks(nullptr, 210, 210);", "timing_patch"),
    ("OpenMP thread count", "", "omp_set_num_threads(1);", "timing_patch"),
    ("system clock", "", "clock_settime(0, nullptr);", "timing_patch"),
    ("stream attribute value", "", "cudaStreamAttrValue v; v.accessPolicyWindow.num_bytes = 1 << 20;", "timing_patch"),
    ("libcu++ access property", "", "auto p = cuda::access_property::persisting{}; (void)p;", "timing_patch"),
    ("PTX evict_last", "", 'asm volatile("ld.global.L2::evict_last.f32 %0, [%1];" : "=f"(r) : "l"(p));',
     "timing_patch"),
    ("PTX createpolicy", "", 'asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));',
     "timing_patch"),
    ("PTX cache policy through a macro", '#define POLICY "ld.global.L2::evict" "_last.f32 %0, [%1];"',
     'asm volatile(POLICY : "=f"(r) : "l"(p));', "timing_patch"),
    ("libc-internal mmap", "", "void* q = __mmap(nullptr, 4096, 7, 0x22, -1, 0); (void)q;", "unsafe_builtin"),
    ("libc-internal dlsym", "", 'void* q = __libc_dlsym(nullptr, "open"); (void)q;', "unsafe_builtin"),
    ("libc-internal prctl", "", "__prctl(4, 0, 0, 0, 0);", "concurrency"),
    ("glibc stdio internals", "", 'auto* f = _IO_new_fopen(p0, "r"); (void)f;', "unsafe_builtin"),
    ("device-wide cache config", "", "cudaDeviceSetCacheConfig(cudaFuncCachePreferShared);", "timing_patch"),
    ("multi-device launch", "", "cudaLaunchCooperativeKernelMultiDevice(nullptr, 2, 0);", "unsafe_builtin"),
    # other devices, contexts, processes, mapped host memory
    ("mapped host memory", "", "float* h; cudaHostAlloc(&h, 64, cudaHostAllocMapped);", "unsafe_builtin"),
    ("pinned host memory", "", "float* h; cudaMallocHost(&h, 64);", "unsafe_builtin"),
    ("host register", "", "cudaHostRegister(nullptr, 64, 0);", "unsafe_builtin"),
    ("managed memory", "", "float* h; cudaMallocManaged(&h, 64);", "unsafe_builtin"),
    ("IPC handle", "", "cudaIpcMemHandle_t h; cudaIpcGetMemHandle(&h, nullptr);", "unsafe_builtin"),
    ("another device", "", "cudaSetDevice(1);", "unsafe_builtin"),
    ("device reset", "", "cudaDeviceReset();", "unsafe_builtin"),
    ("peer copy", "", "cudaMemcpyPeer(nullptr, 1, nullptr, 0, 64);", "unsafe_builtin"),
    ("peer access", "", "cudaDeviceEnablePeerAccess(1, 0);", "unsafe_builtin"),
    ("driver context", "", "CUcontext c; cuCtxCreate(&c, 0, 0);", "unsafe_builtin"),
    ("green context stream", "", "CUstream st; cuGreenCtxStreamCreate(&st, nullptr, 1, 0);", "unsafe_builtin"),
    # rewriting code or memory in place
    ("pkey_mprotect", "", "pkey_mprotect(nullptr, 4096, 7, 0);", "unsafe_builtin"),
    ("pkey_alloc", "", "int k = pkey_alloc(0, 0); (void)k;", "unsafe_builtin"),
    ("mmap PROT_EXEC", "", "void* p = mmap(nullptr, 4096, 7, 0x22, -1, 0); (void)p;", "unsafe_builtin"),
    ("memfd_create", "", 'int fd = memfd_create("x", 0); (void)fd;', "unsafe_builtin"),
    ("process_vm_writev", "", "process_vm_writev(0, nullptr, 0, nullptr, 0, 0);", "unsafe_builtin"),
    ("ptrace", "", "ptrace(0, 0, nullptr, nullptr);", "unsafe_builtin"),
    ("madvise", "", "madvise(nullptr, 4096, 0);", "unsafe_builtin"),
    ("dl_iterate_phdr", "", "dl_iterate_phdr(nullptr, nullptr);", "unsafe_builtin"),
    ("getauxval", "", "unsigned long v = getauxval(33); (void)v;", "unsafe_builtin"),
    ("prctl", "", "prctl(4, 0, 0, 0, 0);", "concurrency"),
    ("prctl header", "#include <sys/prctl.h>", "", "concurrency"),
    # files: path literals and opening anything
    ("/proc/self/mem", "", 'const char* p = "/proc/self/mem"; (void)p;', "unsafe_builtin"),
    ("path in adjacent pieces", "", 'const char* p = "a/pr" "oc/self/mem" + 1; (void)p;', "unsafe_builtin"),
    ("path with hex escapes", "", 'const char* p = "a\\x2fproc\\x2fself/mem" + 1; (void)p;', "unsafe_builtin"),
    ("path with octal escapes", "", 'const char* p = "a\\057dev\\057shm" + 1; (void)p;', "unsafe_builtin"),
    ("absolute path", "", 'const char* p = "/tmp/cache"; (void)p;', "unsafe_builtin"),
    ("/sys path", "", 'const char* p = u8"x/sys" + 1; (void)p;', "unsafe_builtin"),
    ("open", "", "int fd = open(p0, 2); (void)fd;", "unsafe_builtin"),
    ("openat", "", "int fd = openat(-100, p0, 2); (void)fd;", "unsafe_builtin"),
    ("libc-internal open", "", "int fd = __open_2(p0, 2); (void)fd;", "unsafe_builtin"),
    ("fopen", "", 'auto* f = fopen(p0, "r+"); (void)f;', "unsafe_builtin"),
    ("std::ifstream", "", "std::ifstream f(p0);", "unsafe_builtin"),
    ("std::ofstream", "", "std::ofstream f(p0);", "unsafe_builtin"),
    ("std::filesystem", "", "auto e = std::filesystem::exists(p0); (void)e;", "unsafe_builtin"),
    ("fstream header", "#include <fstream>", "", "unsafe_builtin"),
    ("fcntl header", "#include <fcntl.h>", "", "unsafe_builtin"),
    # names banned qualified are banned unqualified too
    ("globalContext after using namespace at", "using namespace at;", "globalContext().setAllowTF32CuBLAS(true);",
     "native_library_compute"),
    ("globalContext from the global scope", "using namespace at;", "::globalContext();", "native_library_compute"),
    ("context setter on any receiver", "", "auto& c = *reinterpret_cast<int*>(0); c.setBenchmarkCuDNN(true);",
     "native_library_compute"),
    ("thread count after using namespace at", "using namespace at;", "set_num_threads(1);", "native_library_compute"),
    ("ATen sub-namespace after using namespace at", "using namespace at;", "auto y = native::mm(xc, xc);",
     "native_library_compute"),
    ("torch nn after using namespace torch", "using namespace torch;", "auto y = nn::functional::relu(xc);",
     "native_library_compute"),
    ("ATen sub-namespace from the global scope", "using namespace at;", "auto y = ::native::mm(xc, xc);",
     "native_library_compute"),
    ("using namespace at::native", "using namespace at::native;", "", "native_library_compute"),
    ("compute op by argument-dependent lookup", "", "auto y = matmul(xc, xc);", "native_library_compute"),
    ("using namespace below at::cuda", "using namespace at::cuda::detail;", "", "native_library_compute"),
    ("compute op after using namespace through an alias", "namespace A = at;\nusing namespace at;",
     "auto y = matmul(xc, xc);", "native_library_compute"),
]


@pytest.mark.parametrize(("name", "top", "body", "rule"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_native_attack_is_refused(name: str, top: str, body: str, rule: str) -> None:
    s = spec(top, body)
    assert rule in rules_of(s), (name, check_native(s, "cpu", RULES))
    assert rule not in rules_of(s, dataclasses.replace(RULES, **{SWITCH[rule]: False}))


def test_writing_pybind11_yourself_is_refused() -> None:
    s = spec("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"relu_forward\", &relu_forward); }", functions=None)
    assert {"unsafe_builtin", "no_kernel"} <= rules_of(s)


HONEST = [
    ("vector at()", "", "std::vector<int> v(3); int a = v.at(0); (void)a;"),
    ("a variable named py", "", "float px = 0.f, py = 1.f; px += py;"),
    ("digit separators", "", "const int64_t big = 1'000'000; (void)big;"),
    ("char and string literals", "", "const char* s = \"a // not a comment\"; char c = '\"'; (void)s; (void)c;"),
    ("using namespace at", "using namespace at;", "auto t = empty_like(xc); (void)t;"),
    ("own namespace", "namespace kern { inline int two() { return 2; } }\nusing namespace kern;", "int k = two(); (void)k;"),
    ("namespace alias of std", "namespace sc = std;", "sc::vector<int> v; (void)v;"),
    ("function-like macros", "#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))\n#define CHECK(x) TORCH_CHECK(x, #x)",
     "CHECK(xc.is_contiguous()); int blocks = CEIL_DIV(7, 2); (void)blocks;"),
    ("templates and numeric_limits", "", "float lo = std::numeric_limits<float>::lowest(); (void)lo;"),
    ("decltype qualified", "", "using T = decltype(xc.numel()); T n = 0; (void)n;"),
    ("ATen allocation", "", "auto z = at::zeros({2}, xc.options()); (void)z;"),
    ("messages with slashes", "", 'TORCH_CHECK(xc.dim() > 0, "weight/bias and mean/dev must match: ", "a/b");'),
    ("write to a descriptor", "#include <unistd.h>", 'if (xc.numel() < 0) { write(2, "x", 1); }'),
    ("names that contain banned words", "", "int open_count = 0, dev = 1, sys_n = 2, mmap_ok = 3; (void)open_count; "
     "(void)dev; (void)sys_n; (void)mmap_ok;"),
    ("using namespace at and torch::indexing", "using namespace at;\nusing namespace torch::indexing;",
     "auto z = empty_like(xc); (void)z;"),
    ("own function named like a context method", "static void setup(int) {}", "setup(1);"),
    ("streaming cache hints and _exit", "", 'if (xc.numel() < 0) { float r = __ldcs(in); asm volatile('
     '"ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(r) : "l"(in)); (void)r; _exit(1); __syncthreads(); }'),
    ("own helpers named like ATen ops", "static inline float relu(float v) { return v > 0.f ? v : 0.f; }",
     "auto gelu = [](float v) { return v; }; float r = relu(gelu(1.f)); (void)r;"),
    ("using namespace c10::cuda, then cuda::", "using namespace c10::cuda;",
     "auto st = cuda::getCurrentCUDAStream(); auto z = std::numeric_limits<float>::max(); (void)st; (void)z;"),
]


@pytest.mark.parametrize(("name", "top", "body"), HONEST, ids=[h[0] for h in HONEST])
def test_honest_native_twins_pass(name: str, top: str, body: str) -> None:
    assert check_native(spec(top, body), "cpu", RULES) == []


def test_cuda_inline_ptx_without_system_calls_passes() -> None:
    cuda = """
#include <torch/extension.h>
#include <cuda_runtime.h>
__global__ void k(float* y) {
    unsigned lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    y[threadIdx.x] = lane;
}
torch::Tensor f(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "input");
    auto y = torch::empty_like(x);
    k<<<1, 32>>>(y.data_ptr<float>());
    return y;
}
"""
    s = ExtensionSpec(name="e", cpp_sources=("torch::Tensor f(torch::Tensor x);",), cuda_sources=(cuda,), functions=("f",))
    assert check_native(s, "cuda", RULES) == []


def test_stripping_reads_literals_as_the_compiler_does() -> None:
    code = "int a = 1'0; f(); int b = 2'0;\nFOOR\"(\"; g(); //)\"\nL'\"'; h();"
    stripped = strip_native(code)
    assert "f()" in stripped and "g()" in stripped and "h()" in stripped
    assert strip_native('R"x(at::mm)x" u8R"(a)" LR"(b)"').count('""') == 3


def test_cuda_runtime_calls_an_honest_kernel_uses_pass() -> None:
    cuda = """
#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>
using namespace at;
__global__ void k(const float* x, float* y, int n) {
    extern __shared__ float tile[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { tile[threadIdx.x] = x[i]; y[i] = tile[threadIdx.x]; }
}
torch::Tensor f(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto y = torch::empty_like(x);
    int dev = 0, blocks = 0;
    cudaGetDevice(&dev);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
    cudaFuncSetCacheConfig(k, cudaFuncCachePreferShared);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, 256, 1024);
    cudaStream_t stream = cuda::getCurrentCUDAStream();
    float* scratch = nullptr;
    cudaMallocAsync(&scratch, 64, stream);
    cudaMemcpyAsync(scratch, x.data_ptr<float>(), 64, cudaMemcpyDeviceToDevice, stream);
    cudaFreeAsync(scratch, stream);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    int n = x.numel();
    k<<<(n + 255) / 256, 256, 1024, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    cudaEventRecord(e, stream);
    cudaEventSynchronize(e);
    cudaEventDestroy(e);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
    cudaStreamSynchronize(stream);
    return y;
}
"""
    s = ExtensionSpec(name="e", cpp_sources=("torch::Tensor f(torch::Tensor x);",), cuda_sources=(cuda,), functions=("f",))
    assert check_native(s, "cuda", RULES) == []


def test_path_pieces_built_at_run_time_are_not_judged_but_cannot_be_opened() -> None:
    """A path spelt as characters passes the literal rule (documented); every way to open it is refused."""
    chars = "const char p1[] = {'/', 'p', 'r', 'o', 'c', 0};"
    assert "unsafe_builtin" not in rules_of(spec(chars))
    assert "unsafe_builtin" in rules_of(spec(chars, "auto* f = fopen(p1, \"r\"); (void)f;"))
