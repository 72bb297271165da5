"""Native rules on what the compiler will see (bench/checks/native.py, native_source.py): Python objects,
processes, dispatcher registration and the preprocessor tricks that hide them are refused; honest twins pass."""
from __future__ import annotations

import dataclasses

import pytest

from kevin_exp.bench.checks.native import check_native, strip_native
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

RULES = CheckRules()
SWITCH = {"unsafe_builtin": "restrict_imports", "native_library_compute": "no_native_library_compute",
          "concurrency": "no_concurrency", "no_kernel": "require_kernel"}

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
