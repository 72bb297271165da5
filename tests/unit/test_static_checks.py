"""Static hack defences: every rule fires on a known hack, its switch turns it off, and realistic
correct candidates pass untouched. No compiles; everything here is AST/regex work."""
from __future__ import annotations

import ast
import dataclasses
import textwrap
import time

import pytest

from kevin_exp.bench.candidate_source import extract_specs
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.checks.native import check_native, strip_native
from kevin_exp.bench.checks.rules import Violation
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

RULES = CheckRules()

CPU_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
// a comment that mentions at::matmul must not count
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const char* note = "cublasSgemm in a string is not a call";
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""

ext = load_inline(name="x", cpp_sources=source, functions=["relu_forward"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_forward(x)
'''

CUDA_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

BLOCK = 256
cuda_src = f"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}}

torch::Tensor relu_forward(torch::Tensor x) {{
    TORCH_CHECK(x.is_cuda(), "x must be CUDA");
    const at::cuda::OptionalCUDAGuard guard(device_of(x));
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    int blocks = (n + {BLOCK} - 1) / {BLOCK};
    relu_kernel<<<blocks, {BLOCK}, 0, at::cuda::getCurrentCUDAStream()>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}}
"""
cpp_src = "torch::Tensor relu_forward(torch::Tensor x);"

relu_ext = load_inline(
    name="relu_ext",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["relu_forward"],
    extra_cuda_cflags=["-O3", "--use_fast_math"],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.op = relu_ext

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.size(0) * 2
        rows = (n + BLOCK - 1) // BLOCK
        assert x.dim() >= 1 and rows >= 0
        return self.op.relu_forward(x.contiguous())
'''

CUDA_LINEAR = '''
import math
import torch
from torch import nn
import torch.utils.cpp_extension

kernel = """
#include <torch/extension.h>
__global__ void linear_kernel(const float* x, const float* w, const float* b, float* y, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = b[col];
        for (int k = 0; k < K; ++k) acc += x[row * K + k] * w[col * K + k];
        y[row * N + col] = acc;
    }
}
torch::Tensor linear_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    auto y = torch::zeros({x.size(0), w.size(0)}, x.options());
    dim3 block(16, 16), grid((w.size(0) + 15) / 16, (x.size(0) + 15) / 16);
    linear_kernel<<<grid, block>>>(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                   y.data_ptr<float>(), x.size(0), w.size(0), x.size(1));
    return y;
}
"""

linear = torch.utils.cpp_extension.load_inline(
    "linear_ext", ["torch::Tensor linear_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b);"],
    [kernel], functions=["linear_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        batch, features = x.shape
        return linear.linear_forward(x.contiguous(), self.weight, self.bias)
'''


def check(src: str, backend: str = "cpu", rules: CheckRules = RULES) -> list[Violation]:
    return check_candidate(textwrap.dedent(src), backend, rules)[1]


def rules_hit(src: str, backend: str = "cpu", rules: CheckRules = RULES) -> set[str]:
    return {v.rule for v in check(src, backend, rules)}


def with_forward(body: str, base: str = CPU_RELU, extra_init: str = "") -> str:
    """CPU_RELU with its forward body replaced (the extension call is kept so no_kernel stays quiet)."""
    src = base.replace("        return ext.relu_forward(x)\n", textwrap.indent(textwrap.dedent(body), " " * 8))
    return src.replace("        super().__init__()\n", "        super().__init__()\n" + textwrap.indent(extra_init, " " * 8), 1)


def with_native(extra: str, base: str = CPU_RELU) -> str:
    marker = "    return out;\n}" if base is CPU_RELU else "    return y;\n}}"
    assert marker in base
    return base.replace(marker, "    " + extra + "\n" + marker, 1)


# --------------------------------------------------------------------------- clean candidates


@pytest.mark.parametrize(("src", "backend"), [(CPU_RELU, "cpu"), (CUDA_RELU, "cuda"), (CUDA_LINEAR, "cuda")])
def test_realistic_candidates_pass(src: str, backend: str) -> None:
    parsed, violations = check_candidate(src, backend, RULES)
    assert violations == []
    assert parsed.unresolved_calls == 0 and len(parsed.specs) == 1


def test_cuda_fstring_source_is_folded() -> None:
    spec = check_candidate(CUDA_RELU, "cuda", RULES)[0].specs[0]
    assert "relu_kernel<<<blocks, 256," in spec.cuda_sources[0] and "{{" not in spec.cuda_sources[0]
    assert spec.functions == ("relu_forward",) and spec.extra_cuda_cflags == ("-O3", "--use_fast_math")


def test_shape_arithmetic_is_not_flagged() -> None:
    body = """
    B, C = x.shape[0], x.shape[1]
    n = x.size(0) * 2 + x.numel() // 4
    m = n + 1
    k = -n
    idx = [i * 2 for i in range(x.dim())]
    if x.dtype != torch.float32 or B * C < 0 or len(idx) > 3:
        raise ValueError("bad input")
    y = x.view(-1).contiguous()
    return ext.relu_forward(y[: m + k + C - B]).view(x.shape)
    """
    assert check(with_forward(body)) == []


def test_extension_function_named_like_a_torch_op_is_fine() -> None:
    src = CPU_RELU.replace("relu_forward", "matmul")
    assert check(src) == []


def test_common_benign_patterns_pass() -> None:
    autograd = """
class ReluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return ext.relu_forward(x)


class ModelNew"""
    src = CPU_RELU.replace("        return ext.relu_forward(x)\n", "        return ReluFn.apply(input)\n")
    src = src.replace("def forward(self, x):", "def forward(self, input):").replace("\nclass ModelNew", autograd, 1)
    assert check(src) == []  # autograd.Function wrapper, a parameter named like the builtin `input`
    body = """
    lowest = torch.finfo(x.dtype).min
    if x.numel() == 0 or lowest > 0:
        return x.new_empty(x.shape)
    return ext.relu_forward(x.to(torch.float32).contiguous())
    """
    assert check(with_forward(body)) == []


def test_helpers_called_from_forward_are_checked_too() -> None:
    src = CPU_RELU.replace("\nclass ModelNew", "\ndef combine(a, b):\n    return a @ b\n\n\nclass ModelNew", 1)
    src = src.replace("return ext.relu_forward(x)", "return ext.relu_forward(combine(x, x))")
    (v,) = check(src)
    assert v.rule == "torch_compute" and "`a @ b`" in v.message


def test_extra_python_bypasses() -> None:
    cases = {
        "getattr(x, 'matmul')(x)": "torch_compute",
        "type(x).matmul(x, x)": "torch_compute",
        "x.__matmul__(x)": "unsafe_builtin",
        "torch.Tensor.add(x, x)": "torch_compute",
        "x.numpy()": "torch_compute",
        "torch.nn.modules.activation.ReLU()(x)": "torch_nn",
    }
    for expr, rule in cases.items():
        assert rule in rules_hit(with_forward(f"return ext.relu_forward({expr})\n")), expr
    shadowed = with_forward("def g(eval):\n    return eval\nreturn ext.relu_forward(g(x))\n")
    assert "unsafe_builtin" not in rules_hit(shadowed)  # a parameter named eval is not the builtin


# --------------------------------------------------------------------------- one case per rule

CASES: list[tuple[str, str, str, str]] = [
    # (rule, CheckRules switch, source, backend)
    ("torch_nn", "no_torch_nn", with_forward("return ext.relu_forward(self.fc(x))\n", extra_init="self.fc = nn.Linear(4, 4)\n"), "cpu"),
    ("torch_nn", "no_torch_nn", with_forward("return ext.relu_forward(F.relu(x))\n").replace(
        "import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n"), "cpu"),
    ("torch_nn", "no_torch_nn", with_forward("return relu(ext.relu_forward(x))\n").replace(
        "import torch\n", "import torch\nfrom torch.nn.functional import relu\n"), "cpu"),
    ("torch_nn", "no_torch_nn", with_forward("return ext.relu_forward(getattr(nn, 'ReLU')()(x))\n"), "cpu"),
    ("torch_nn", "no_torch_nn", CPU_RELU.replace("import torch.nn as nn\n", "from torch import nn\nfrom torch.nn import Linear\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("return ext.relu_forward(torch.matmul(x, x))\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("return ext.relu_forward(x.matmul(x))\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("return ext.relu_forward(x).relu()\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("w = x.t()\nreturn ext.relu_forward(x @ w)\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("return ext.relu_forward(x) + self.bias\n",
                                                       extra_init="self.bias = nn.Parameter(torch.zeros(4))\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("out = ext.relu_forward(x)\nreturn out * 2\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("out = ext.relu_forward(x)\nout += x\nreturn out\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("return abs(ext.relu_forward(x))\n"), "cpu"),
    ("unsafe_builtin", "restrict_imports", with_forward("return ext.relu_forward(torch.ops.aten.mm(x, x))\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("return ext.relu_forward(getattr(torch, 'matmul')(x, x))\n"), "cpu"),
    ("torch_compute", "no_torch_compute", with_forward("mm = torch.mm\nreturn ext.relu_forward(mm(x, x))\n"), "cpu"),
    ("torch_compute", "no_torch_compute", CPU_RELU.replace("import torch\n", "import torch\nfrom torch import matmul\n"), "cpu"),
    ("try_except", "no_try_except", with_forward("try:\n    return ext.relu_forward(x)\nexcept Exception:\n    return x.clamp(min=0)\n"), "cpu"),
    ("pass", "no_pass", CPU_RELU + "\nclass Unused:\n    pass\n", "cpu"),
    ("reference_subclass", "no_reference_subclass", CPU_RELU.replace("class ModelNew(nn.Module)", "class ModelNew(Model)"), "cpu"),
    ("reference_subclass", "no_reference_subclass", CPU_RELU + "\nModelNew = Model\n", "cpu"),
    ("no_kernel", "require_kernel", CPU_RELU.replace("return ext.relu_forward(x)", "return x.clone()"), "cpu"),
    ("no_kernel", "require_kernel", CPU_RELU.replace("ext = load_inline(", "ext = dict(").replace(
        "from torch.utils.cpp_extension import load_inline\n", ""), "cpu"),
    ("no_kernel", "require_kernel", CPU_RELU.replace("class ModelNew(nn.Module)", "class Model2(nn.Module)"), "cpu"),
    ("no_kernel", "require_kernel", CPU_RELU, "cuda"),  # no __global__ kernel on the cuda backend
    ("no_kernel", "require_kernel", CUDA_RELU, "cpu"),  # cuda_sources on the cpu backend
    ("no_kernel", "require_kernel", CUDA_RELU.replace("relu_kernel<<<blocks, {BLOCK}, 0, at::cuda::getCurrentCUDAStream()>>>",
                                                      "relu_kernel"), "cuda"),  # kernel never launched
    ("no_kernel", "require_kernel", CPU_RELU.replace('functions=["relu_forward"]', 'functions=["other"]'), "cpu"),
    ("concurrency", "no_concurrency", CPU_RELU.replace("import torch\n", "import torch\nimport threading\n"), "cpu"),
    ("concurrency", "no_concurrency", with_forward("s = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    return ext.relu_forward(x)\n"), "cpu"),
    ("concurrency", "no_concurrency", with_forward("y = ext.relu_forward(x)\ny.record_stream(None)\nreturn y\n"), "cpu"),
    ("concurrency", "no_concurrency", with_native("cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);", CUDA_RELU), "cuda"),
    ("concurrency", "no_concurrency", with_native("std::thread t([]{}); t.detach();"), "cpu"),
    ("timing_patch", "no_timing_patch", CPU_RELU + "\nimport time\ntime.perf_counter = lambda: 0.0\n", "cpu"),
    ("timing_patch", "no_timing_patch", CPU_RELU + "\ntorch.cuda.synchronize = lambda: None\n", "cpu"),
    ("timing_patch", "no_timing_patch", CPU_RELU + "\nsetattr(torch.cuda.Event, 'elapsed_time', lambda *a: 0.001)\n", "cpu"),
    ("timing_patch", "no_timing_patch", CPU_RELU + "\nnn.Module.__call__ = None\n", "cpu"),
    ("import", "restrict_imports", CPU_RELU.replace("import torch\n", "import torch\nimport os\n"), "cpu"),
    ("import", "restrict_imports", CPU_RELU.replace("import torch\n", "import torch\nfrom numpy import dot\n"), "cpu"),
    ("unsafe_builtin", "restrict_imports", CPU_RELU + '\n_os = __import__("os")\n', "cpu"),
    ("unsafe_builtin", "restrict_imports", CPU_RELU + '\nx = eval("1 + 1")\n', "cpu"),
    ("unsafe_builtin", "restrict_imports", with_forward("name = 'relu_forward'\nreturn getattr(ext, name)(x)\n"), "cpu"),
    ("unsafe_builtin", "restrict_imports", with_forward("k = self.__class__\nreturn ext.relu_forward(x)\n"), "cpu"),
    ("unsafe_builtin", "restrict_imports", CPU_RELU + "\nclass Lazy(torch.Tensor):\n    x = 1\n", "cpu"),
    ("unsafe_builtin", "restrict_imports", CPU_RELU + "\ntorch._C._set_grad_enabled(False)\n", "cpu"),
    ("unsafe_builtin", "restrict_imports", with_native('PyRun_SimpleString("import time");'), "cpu"),
    ("unsafe_builtin", "restrict_imports", with_native('auto r = py::cast(xc).attr("matmul")(xc);'), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = at::_ops::mm::call(xc, xc);"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("namespace A = at; out = A::mm(xc, xc);"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("#define CAT(a, b) a##b"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = at::matmul(x, x);"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = torch::nn::functional::relu(x);"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = xc.matmul(xc);"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = xc.relu_();"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("cublasHandle_t h; cublasCreate(&h);", CUDA_RELU), "cuda"),
    ("native_library_compute", "no_native_library_compute", CUDA_RELU.replace("#include <torch/extension.h>\n", "#include <torch/extension.h>\n#include <cublas_v2.h>\n", 1), "cuda"),
    ("native_library_compute", "no_native_library_compute", CUDA_RELU.replace('"--use_fast_math"]', '"--use_fast_math"], extra_ldflags=["-lcublas"]'), "cuda"),
    ("native_library_compute", "no_native_library_compute", with_native("c10::impl::ExcludeDispatchKeyGuard g(c10::DispatchKey::Python);"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = matmul(xc, xc);").replace("#include <torch/extension.h>\n", "#include <torch/extension.h>\nusing namespace at;\n"), "cpu"),
    ("native_library_compute", "no_native_library_compute", with_native("out = NS::ma\\\ntmul(xc, xc);").replace("#include <torch/extension.h>\n", "#include <torch/extension.h>\n#define NS at\n"), "cpu"),
]


@pytest.mark.parametrize(("rule", "switch", "src", "backend"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_and_switch_disables_it(rule: str, switch: str, src: str, backend: str) -> None:
    violations = check(src, backend)
    assert rule in {v.rule for v in violations}, violations
    for v in violations:
        assert v.message and (v.line is None or f"line {v.line}" in v.message)
    off = dataclasses.replace(RULES, **{switch: False})
    assert rule not in rules_hit(src, backend, off)


def test_message_names_the_op_and_line() -> None:
    src = with_forward("return ext.relu_forward(torch.matmul(x, x))\n")
    (v,) = check(src)
    assert v.rule == "torch_compute" and v.line == src.splitlines().index("        return ext.relu_forward(torch.matmul(x, x))") + 1
    assert v.message.startswith(f"line {v.line}: torch.matmul is a PyTorch compute op")


def test_all_rules_off_allows_everything() -> None:
    off = CheckRules(**{f.name: False for f in dataclasses.fields(CheckRules)})
    bad = with_forward("try:\n    return torch.matmul(x, x) @ x\nexcept Exception:\n    pass\n")
    assert check(bad, "cpu", off) == []


def test_violations_are_in_source_order() -> None:
    src = CPU_RELU + "\nimport os\ntry:\n    y = 1\nexcept Exception:\n    y = 2\n"
    lines = [v.line for v in check(src)]
    assert lines == sorted(lines) and len(lines) == 2


# --------------------------------------------------------------------------- native stripping


def test_strip_native_removes_comments_and_literals_only() -> None:
    code = 'a = "at::matmul // x"; /* at::mm(\n */ b = \'"\'; // cublasSgemm\nR"X(at::bmm)X"; at::kFloat'
    stripped = strip_native(code)
    assert "matmul" not in stripped and "cublas" not in stripped and "bmm" not in stripped
    assert stripped.count("\n") == code.count("\n") and "at::kFloat" in stripped


def test_check_native_direct() -> None:
    spec = ExtensionSpec(name="e", cpp_sources=("#include <cudnn.h>\nint f() { return 0; }",), functions=("f",))
    (v,) = check_native(spec, "cpu", RULES)
    assert v.rule == "native_library_compute" and "cudnn.h" in v.message
    assert check_native(spec, "cpu", dataclasses.replace(RULES, no_native_library_compute=False)) == []


# --------------------------------------------------------------------------- extract_specs


def specs_of(src: str):
    return extract_specs(ast.parse(textwrap.dedent(src)))


def test_extract_concatenation_and_alias() -> None:
    parsed = specs_of('''
        from torch.utils.cpp_extension import load_inline as li
        header = "#include <torch/extension.h>\\n"
        body = ("int f() "
                "{ return 1; }")
        ext = li(name="a", cpp_sources=header + body, functions=["f"], build_directory=somewhere())
    ''')
    assert parsed.unresolved_calls == 0
    (spec,) = parsed.specs
    assert spec.cpp_sources == ("#include <torch/extension.h>\nint f() { return 1; }",) and spec.functions == ("f",)


def test_extract_fstring_list_positional_and_format() -> None:
    parsed = specs_of('''
        import torch.utils.cpp_extension as ce
        N = 4
        kern = f"__global__ void k() {{ int a[{N}]; }}"
        decl = "void g(int);".replace("int", "long")
        fns = ("g",)
        flags = ["-O3"] + ["-DN={}".format(N)]
        ext = ce.load_inline("b", [decl], [kern, "// tail"], None, fns, extra_cuda_cflags=flags)
    ''')
    (spec,) = parsed.specs
    assert spec.name == "b" and spec.cpp_sources == ("void g(long);",)
    assert spec.cuda_sources == ("__global__ void k() { int a[4]; }", "// tail")
    assert spec.functions == ("g",) and spec.extra_cuda_cflags == ("-O3", "-DN=4")


def test_extract_call_inside_init_uses_module_constants() -> None:
    parsed = specs_of('''
        import torch
        SRC = "int f() { return 1; }"
        class ModelNew(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ext = torch.utils.cpp_extension.load_inline(name="c", cpp_sources=SRC, functions="f")
    ''')
    assert parsed.unresolved_calls == 0 and parsed.specs[0].functions == ("f",)


@pytest.mark.parametrize("src", [
    # value built at run time
    'from torch.utils.cpp_extension import load_inline\nsrc = open("k.cu").read()\next = load_inline(name="d", cpp_sources=src)',
    # list mutated after binding: the folded value would be stale
    'from torch.utils.cpp_extension import load_inline\nsrcs = ["a"]\nsrcs.append("b")\next = load_inline(name="d", cpp_sources=srcs)',
    # rebound from a function through `global`
    'from torch.utils.cpp_extension import load_inline\nS = "a"\ndef f():\n    global S\n    S = "b"\next = load_inline(name="d", cpp_sources=S)',
    # generator expression
    'from torch.utils.cpp_extension import load_inline\next = load_inline(name="d", cpp_sources="".join(chr(c) for c in [97]))',
])
def test_extract_unresolvable_calls_are_counted(src: str) -> None:
    parsed = specs_of(src)
    assert parsed.specs == [] and parsed.unresolved_calls == 1


def test_a_local_function_named_load_inline_is_not_a_build() -> None:
    src = CPU_RELU.replace("from torch.utils.cpp_extension import load_inline\n", "def load_inline(**kw):\n    return kw\n")
    parsed, violations = check_candidate(src, "cpu", RULES)
    assert parsed.specs == [] and parsed.unresolved_calls == 0
    assert "no_kernel" in {v.rule for v in violations}


@pytest.mark.parametrize("src", [
    'import torch\nfrom torch.utils.cpp_extension import load_inline\ns = "x" * 10**9\next = load_inline(name="a", cpp_sources=s)',
    'import torch\nfrom torch.utils.cpp_extension import load_inline\ns = f"{1:>999999999}"\next = load_inline(name="a", cpp_sources=s)',
    'import torch\nfrom torch.utils.cpp_extension import load_inline\ns = "{:>999999999}".format(1)\next = load_inline(name="a", cpp_sources=s)',
    'import torch\nfrom torch.utils.cpp_extension import load_inline\ns = "ab" * 1000000\nl = [s] * 4096\next = load_inline(name="a", cpp_sources=l)',
])
def test_folding_refuses_memory_bombs(src: str) -> None:
    start = time.perf_counter()
    parsed, _ = check_candidate(src, "cpu", RULES)
    assert parsed.specs == [] and parsed.unresolved_calls == 1
    assert time.perf_counter() - start < 5


def test_native_scan_is_linear_on_unterminated_comments() -> None:
    start = time.perf_counter()
    for text in ("/*" * 200_000, 'R"x(' * 100_000, '"' + "a" * 400_000):
        check_native(ExtensionSpec(name="e", cpp_sources=(text,)), "cpu", RULES)
    assert time.perf_counter() - start < 5


def test_syntax_errors_propagate() -> None:
    with pytest.raises(SyntaxError):
        check_candidate("def f(:\n", "cpu", RULES)
