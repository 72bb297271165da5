"""Build flags a candidate may pass: the ones candidates use pass, the ones that run or write things do not."""
from __future__ import annotations

import pytest

from kevin_exp.bench.build.builder import Builder, BuildError
from kevin_exp.bench.build.user_flags import unsafe_flags
from kevin_exp.bench.checks.native import check_native
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

SRC = "torch::Tensor f(torch::Tensor x) { return x; }"


def spec(**kw) -> ExtensionSpec:
    return ExtensionSpec(**{"name": "ext", "cpp_sources": (SRC,), "functions": ("f",), **kw})


@pytest.mark.parametrize("flags", [
    ("-O3", "-fopenmp"), ("-O2",), ("",), ("-O3", "-std=c++17", "-DBLOCK=256", "-UNDEBUG", "-march=native",
    "-mavx2", "-mfma", "-ffast-math", "-funroll-loops", "-fno-strict-aliasing", "-Wall", "-Wno-unused-variable", "-g"),
])
def test_flags_candidates_use_are_accepted(flags) -> None:
    assert unsafe_flags(spec(extra_cflags=flags, extra_ldflags=("-fopenmp", "-lm", ""))) == []


@pytest.mark.parametrize("flags", [
    ("-O3",), ("-O3", "--use_fast_math"), ("-use_fast_math", "-lineinfo", "--ftz=true", "--prec-div=false"),
    ("-std=c++17", "--expt-relaxed-constexpr", "--extended-lambda", "-maxrregcount=64"),
    ("-Xptxas", "-v"), ("-Xptxas=-O3",), ("-arch=sm_90a",), ("-gencode", "arch=compute_90,code=sm_90"),
    ("-Xcompiler", "-O3,-fopenmp"), ("--compiler-options", "-march=native"), ("-DUSE_TC=1", ""),
    ("-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__"), ("--generate-line-info", "--threads", "4"),
    ("--ptxas-options=-v", "-gencode=arch=compute_90a,code=sm_90a"),
])
def test_nvcc_flags_candidates_use_are_accepted(flags) -> None:
    assert unsafe_flags(spec(extra_cuda_cflags=flags)) == []


@pytest.mark.parametrize("cflags", [
    ("-wrapper", "/bin/sh,-c,touch /tmp/x"), ("-fplugin=/tmp/evil.so",), ("-specs=/tmp/evil.specs",),
    ("-B/tmp/bin",), ("@/tmp/args",), ("-o", "/root/.bashrc"), ("-Wl,--version-script=/etc/passwd",),
    ("-Xlinker", "-plugin"), ("-fdump-tree-all=/etc/x",), ("-save-temps=obj",), ("-include", "/etc/shadow"),
    ("-D X=1; rm -rf /",), ("-I/root",), ("-fprofile-generate=/etc",),
])
def test_cflags_that_run_or_write_things_are_refused(cflags) -> None:
    assert unsafe_flags(spec(extra_cflags=cflags))


@pytest.mark.parametrize("cuda_flags", [
    ("-ccbin", "/tmp/fake-gcc"), ("--compiler-bindir=/tmp",), ("-Xcompiler", "-wrapper,/bin/sh"),
    ("-Xcompiler=-fplugin=/tmp/p.so",), ("--keep-dir", "/etc"), ("-o", "/etc/x"), ("-Xlinker", "-rpath=/tmp"),
    ("--options-file", "/tmp/opts"), ("-Xptxas", "--output-file=/etc/x"), ("-arch", "sm_90;touch"),
])
def test_nvcc_flags_that_run_or_write_things_are_refused(cuda_flags) -> None:
    assert unsafe_flags(spec(extra_cuda_cflags=cuda_flags))


@pytest.mark.parametrize("ldflags", [("-L/tmp",), ("-Wl,-rpath,/tmp",), ("/tmp/evil.so",), ("-shared",)])
def test_link_flags_outside_the_list_are_refused(ldflags) -> None:
    assert unsafe_flags(spec(extra_ldflags=ldflags))


def test_vendor_libraries_are_left_to_their_switchable_rule() -> None:
    cublas = spec(extra_ldflags=("-lcublas",))
    assert unsafe_flags(cublas) == []
    assert [v.rule for v in check_native(cublas, "cpu", CheckRules())] == ["native_library_compute"]
    assert check_native(cublas, "cpu", CheckRules(no_native_library_compute=False)) == []


def test_a_refused_flag_is_forbidden_whatever_rules_are_switched_off() -> None:
    off = CheckRules(**{f: False for f in CheckRules.__dataclass_fields__})
    violations = check_native(spec(extra_cflags=("-O3", "-wrapper", "/bin/sh,-c,id")), "cpu", off)
    assert [v.rule for v in violations] == ["build_flags"]
    assert "'-wrapper'" in violations[0].message and "allowed:" in violations[0].message


def test_the_builder_refuses_them_too(tmp_path) -> None:
    """Specs can reach the builder without the static checks (a direct caller, a spec made at run time)."""
    with pytest.raises(BuildError, match="not allowed"):
        Builder(tmp_path, backend="cpu").build(spec(extra_cflags=("-wrapper", "/bin/sh,-c,touch /tmp/x")))
