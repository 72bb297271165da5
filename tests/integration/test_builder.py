"""Real compiles with the extension builder (the session's build cache; KEVIN_EXP_CACHE keeps it).

Sources carry a per-session salt so "cold" builds are cold even in a reused cache.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from kevin_exp.bench.build.builder import Builder, BuildError, import_extension
from kevin_exp.bench.spec import ExtensionSpec

SALT = uuid.uuid4().hex
SCALE_ADD = r"""
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y, double alpha) {
  TORCH_CHECK(x.sizes() == y.sizes(), "shape mismatch: ", x.sizes(), " vs ", y.sizes());
  auto xc = x.contiguous(), yc = y.contiguous();
  auto out = torch::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "scale_add", [&] {
    const scalar_t* a = xc.data_ptr<scalar_t>(); const scalar_t* b = yc.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = a[i] * static_cast<scalar_t>(alpha) + b[i];
  });
  return out;
}
"""


def cpp_spec(tag: str, source: str = SCALE_ADD, functions: tuple[str, ...] | None = ("scale_add",),
             **kw) -> ExtensionSpec:
    return ExtensionSpec(name="t_" + tag.replace("-", "_"), cpp_sources=(f"{source}\n// {SALT} {tag}\n",), functions=functions, **kw)


@pytest.fixture(scope="module")
def builder(build_cache: Path) -> Builder:
    return Builder(build_cache)


@pytest.fixture(scope="module")
def first_build(builder: Builder):
    spec = cpp_spec("basic")
    return spec, builder.build(spec)


def test_builds_and_computes(first_build) -> None:
    spec, result = first_build
    assert not result.cached and result.so_path.exists() and result.module_name == f"kx_{result.key[:16]}"
    module = import_extension(result)
    assert module.__name__ == result.module_name
    x, y = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(module.scale_add(x, y, 2.5), 2.5 * x + y)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # c10::Error -> RuntimeError, as torch does
        module.scale_add(x, torch.zeros(3, dtype=torch.float64), 1.0)
    doc = module.scale_add.__doc__
    assert doc.startswith("scale_add(arg0: torch.Tensor, arg1: torch.Tensor, arg2: ") and doc.endswith("\n\nscale_add\n")
    meta = json.loads((result.so_path.parent / "meta.json").read_text())
    assert meta["key"] == result.key and meta["steps"]


def test_same_spec_again_is_a_fast_hit(builder: Builder, first_build) -> None:
    spec, first = first_build
    again = builder.build(spec)
    assert again.cached and again.so_path == first.so_path and again.seconds < first.seconds
    assert builder.lookup(spec) is not None
    # a fresh process: lookup + import after `import torch`
    code = ("import json, sys, time, torch; from pathlib import Path; t = time.perf_counter()\n"
            "from kevin_exp.bench.build.builder import Builder, import_extension\n"
            "from kevin_exp.bench.spec import ExtensionSpec\n"
            "r = Builder(Path(sys.argv[1])).lookup(ExtensionSpec(**json.loads(sys.argv[2])))\n"
            "m = import_extension(r); print(json.dumps([r.cached, time.perf_counter() - t, m.__name__]))")
    fields = {k: getattr(spec, k) for k in spec.__dataclass_fields__}
    out = subprocess.run([sys.executable, "-c", code, str(builder.cache_dir), json.dumps(fields)],
                         capture_output=True, text=True, check=True)
    cached, seconds, name = json.loads(out.stdout.strip().splitlines()[-1])
    assert cached and name == first.module_name
    assert seconds < 2.0, f"cache hit took {seconds:.2f} s in a fresh process"


def test_lookup_misses_without_building(builder: Builder) -> None:
    spec = cpp_spec("never-built")
    assert builder.lookup(spec) is None
    assert not (builder.cache_dir / "ext" / builder.cache_key(spec)[:2] / builder.cache_key(spec)).exists()


_CONCURRENT = r"""
import json, os, sys
from pathlib import Path
from kevin_exp.bench.build.builder import Builder
from kevin_exp.bench.spec import ExtensionSpec
r = Builder(Path(sys.argv[1])).build(ExtensionSpec(**json.loads(sys.argv[2])))
print(json.dumps({"cached": r.cached, "so": str(r.so_path), "pid": os.getpid()}))
"""


def test_two_processes_build_one_key_once(builder: Builder) -> None:
    spec = cpp_spec("concurrent")
    fields = json.dumps({k: getattr(spec, k) for k in spec.__dataclass_fields__})
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, str(builder.cache_dir), fields],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    assert outs[0]["so"] == outs[1]["so"]
    builders = [o for o in outs if not o["cached"]]
    assert len(builders) == 1, outs  # the other waited on the key's lock, then found the entry
    meta = json.loads((Path(outs[0]["so"]).parent / "meta.json").read_text())
    assert meta["pid"] == builders[0]["pid"]
    assert not list(Path(outs[0]["so"]).parent.parent.glob(".tmp-*"))


def _no_entry(builder: Builder, spec: ExtensionSpec) -> bool:
    key = builder.cache_key(spec)
    final = builder.cache_dir / "ext" / key[:2] / key
    return not final.exists() and not list(final.parent.glob(f".tmp-{key}-*"))


def test_syntax_error_is_a_build_error_with_the_log(builder: Builder) -> None:
    spec = cpp_spec("syntax", "torch::Tensor f(torch::Tensor x) { return x }", functions=("f",))
    with pytest.raises(BuildError) as info:
        builder.build(spec)
    assert "\n" not in str(info.value) and "error" in str(info.value)
    assert "expected" in info.value.log and "main.cpp" in info.value.log
    assert _no_entry(builder, spec)


def test_a_failed_build_is_remembered_like_a_good_one(build_cache: Path) -> None:
    spec = cpp_spec("remembered-failure", "torch::Tensor g(torch::Tensor x) { return x + }", functions=("g",))
    with pytest.raises(BuildError) as first:
        Builder(build_cache).build(spec)
    t0 = time.perf_counter()
    with pytest.raises(BuildError) as again:  # another builder on the same cache: a restarted evaluator
        Builder(build_cache).build(spec)
    assert time.perf_counter() - t0 < 1.0 and again.value.cached and not first.value.cached
    assert str(again.value) == str(first.value) and again.value.log == first.value.log
    assert Builder(build_cache).lookup(spec) is None


def test_timeout_kills_the_compiler(build_cache: Path) -> None:
    # each constexpr evaluation runs into gcc's operation limit after seconds; 40 of them take minutes
    spin = ("template <int K> constexpr long spin() { long s = 0; for (long i = 0; i < 300000; ++i) "
            "for (long j = 0; j < 300000; ++j) s += i ^ j ^ K; return s; }\n")
    source = spin + "".join(f"constexpr long v{k} = spin<{k}>();\n" for k in range(40))
    spec = cpp_spec("timeout", source, functions=())
    slow = Builder(build_cache, timeout_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(BuildError, match="timed out") as info:
        slow.build(spec)
    assert time.monotonic() - t0 < 60 and _no_entry(slow, spec)
    module = slow.module_name(slow.cache_key(spec))
    time.sleep(0.5)
    leftovers = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, module)]
    assert not leftovers, "compiler processes survived the timeout"
    # a timeout may be the machine's load, not the sources: it was tried again, and is not remembered
    assert info.value.attempts == 2 and info.value.kind == "infra"
    assert not slow._failure(slow.cache_key(spec)).exists()


def _cmdline_has(proc_dir: Path, needle: str) -> bool:
    try:
        return needle.encode() in (proc_dir / "cmdline").read_bytes()
    except OSError:
        return False


def test_key_changes_when_flags_or_sources_change(builder: Builder) -> None:
    base = cpp_spec("key")
    assert builder.cache_key(base) == builder.cache_key(cpp_spec("key"))
    assert builder.cache_key(base) != builder.cache_key(cpp_spec("key", extra_cflags=("-O3",)))
    assert builder.cache_key(base) != builder.cache_key(cpp_spec("key2"))


def test_own_pybind_module_with_a_literal_name(builder: Builder) -> None:
    source = SCALE_ADD + '\nPYBIND11_MODULE(t_own, m) { m.def("scale_add", &scale_add, "doc"); }'
    result = builder.build(cpp_spec("own", source, functions=None))
    module = import_extension(result)
    assert module.__name__ == result.module_name and module.scale_add.__doc__.endswith("doc\n")
    torch.testing.assert_close(module.scale_add(torch.ones(2), torch.ones(2), 3.0), torch.full((2,), 4.0))


def test_source_beyond_the_lean_headers_falls_back_to_torchs(builder: Builder) -> None:
    source = "torch::Tensor mm(torch::Tensor a, torch::Tensor b) { return torch::matmul(a, b) + 1; }"
    result = builder.build(cpp_spec("full", source, functions=("mm",)))
    a = torch.randn(3, 3)
    torch.testing.assert_close(import_extension(result).mm(a, a), a @ a + 1)
    steps = json.loads((result.so_path.parent / "meta.json").read_text())["steps"]
    assert any("full headers" in s["step"] for s in steps)


def test_a_flag_set_used_twice_compiles_against_its_precompiled_header(tmp_path: Path) -> None:
    builder = Builder(tmp_path)  # a fresh cache: no PCH yet (a flag set gets one on its second use)
    first = builder.build(cpp_spec("pch-1"))
    second = builder.build(cpp_spec("pch-2"))

    def main_unit(result) -> dict:
        steps = json.loads((result.so_path.parent / "meta.json").read_text())["steps"]
        return next(s for s in steps if s["step"] == "g++ main.cpp")

    assert not main_unit(first)["pch"] and main_unit(second)["pch"]
    assert list((tmp_path / "pch").glob("*/torch/extension.h.gch")) and not list((tmp_path / "pch").glob("*.failed"))
    x, y = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(import_extension(second).scale_add(x, y, 2.0), 2.0 * x + y)


def test_fast_module_matches_torchs_load_inline(build_cache: Path) -> None:
    spec = cpp_spec("parity", extra_cflags=("-O2",))
    fast_mod = import_extension(Builder(build_cache).build(spec))
    torch_mod = import_extension(Builder(build_cache, mode="torch").build(spec))
    assert fast_mod.__name__ != torch_mod.__name__
    assert fast_mod.scale_add.__doc__ == torch_mod.scale_add.__doc__
    x = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(fast_mod.scale_add(x, x, 0.5), torch_mod.scale_add(x, x, 0.5))
    for mod in (fast_mod, torch_mod):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            mod.scale_add(x, 3, 1.0)


CUDA_CPP = "torch::Tensor add_one(torch::Tensor x);"
CUDA_SRC = r"""
#include <ATen/cuda/CUDAContext.h>
__global__ void add_one_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
torch::Tensor add_one(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  add_one_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""


@pytest.mark.gpu  # skipped without a GPU by tests/conftest.py
def test_cuda_extension(build_cache: Path) -> None:
    gpu = Builder(build_cache, backend="cuda")
    spec = ExtensionSpec(name="cu", cpp_sources=(CUDA_CPP,), cuda_sources=(CUDA_SRC + f"// {SALT}\n",),
                         functions=("add_one",), extra_cuda_cflags=("-O3",))
    result = gpu.build(spec)
    x = torch.randn(1000, device="cuda")
    torch.testing.assert_close(import_extension(result).add_one(x), x + 1)
    assert gpu.build(spec).cached
