"""Pure logic of the extension builder: cache keys, layout, locks, source rewriting (no compiles)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kevin_exp.bench.build import cache, fast, flags, glue, lean
from kevin_exp.bench.build.builder import Builder, BuildError
from kevin_exp.bench.spec import ExtensionSpec

SRC = "torch::Tensor f(torch::Tensor x) { return x; }"


def spec(**kw) -> ExtensionSpec:
    base = dict(name="ext", cpp_sources=(SRC,), functions=("f",))
    return ExtensionSpec(**{**base, **kw})


@pytest.fixture
def builder(tmp_path: Path) -> Builder:
    return Builder(tmp_path)


def test_key_is_stable_sha256(builder: Builder) -> None:
    key = builder.cache_key(spec())
    assert key == builder.cache_key(spec()) and len(key) == 64 and int(key, 16) >= 0
    assert builder.module_name(key) == f"kx_{key[:16]}"


@pytest.mark.parametrize("change", [
    dict(cpp_sources=(SRC + " ",)),
    dict(extra_cflags=("-O3",)),
    dict(extra_ldflags=("-lm",)),
    dict(extra_include_paths=("/opt",)),
    dict(functions=("f", "g")),
    dict(functions=None),
])
def test_key_changes_with_sources_and_flags(builder: Builder, change: dict) -> None:
    assert builder.cache_key(spec(**change)) != builder.cache_key(spec())


def test_key_depends_on_mode_and_backend(tmp_path: Path) -> None:
    keys = {Builder(tmp_path, mode=m).cache_key(spec()) for m in ("fast", "torch")}
    keys.add(Builder(tmp_path, backend="cuda", cuda_arch="9.0a").cache_key(spec()))
    assert len(keys) == 3


def test_cuda_arch_is_part_of_the_key(tmp_path: Path) -> None:
    cu = spec(cuda_sources=("__global__ void k() {}",))
    keys = {Builder(tmp_path, backend="cuda", cuda_arch=a).cache_key(cu) for a in ("9.0a", "8.0")}
    assert len(keys) == 2


def test_name_only_matters_through_a_literal_module_name(builder: Builder) -> None:
    assert builder.cache_key(spec(name="a")) == builder.cache_key(spec(name="b"))
    own = SRC + "\nPYBIND11_MODULE(a, m) { m.def(\"f\", &f); }"
    assert builder.cache_key(spec(name="a", cpp_sources=(own,))) != builder.cache_key(spec(name="b", cpp_sources=(own,)))


def test_literal_module_name_is_renamed_only_when_it_is_the_specs() -> None:
    src = "PYBIND11_MODULE( my_ext , m) {}"
    assert glue.rename_literal_module(src, "my_ext") == "PYBIND11_MODULE( TORCH_EXTENSION_NAME , m) {}"
    assert glue.rename_literal_module(src, "other") == src
    assert glue.rename_literal_module("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}", "x").count("TORCH_EXTENSION_NAME") == 1


def test_layout(tmp_path: Path) -> None:
    key = "ab" + "0" * 62
    final = cache.entry_dir(tmp_path, "ext", key)
    assert final == tmp_path / "ext" / "ab" / key
    assert cache.lock_path(final) == tmp_path / "ext" / "ab" / f"{key}.lock"
    assert cache.entry_dir(tmp_path, "pch", key) == tmp_path / "pch" / key


def test_tmp_dirs_and_atomic_publish(tmp_path: Path) -> None:
    final = tmp_path / "ext" / "ab" / "abkey"
    stale = final.parent / ".tmp-abkey-1-dead"
    stale.mkdir(parents=True)
    with cache.locked(cache.lock_path(final)):
        tmp = cache.new_tmp_dir(final)
        assert not stale.exists() and tmp.parent == final.parent
        (tmp / "x.so").write_text("so")
        cache.publish(tmp, final)
    assert (final / "x.so").read_text() == "so" and not tmp.exists()


def test_try_locked_does_not_wait(tmp_path: Path) -> None:
    lock = tmp_path / "k.lock"
    with cache.locked(lock):
        with cache.try_locked(lock) as mine:
            assert mine is False
    with cache.try_locked(lock) as mine:
        assert mine is True


def test_toolchain_identity_is_memoised_on_disk(tmp_path: Path) -> None:
    ident = flags.toolchain_id(False, tmp_path)
    [saved] = list((tmp_path / "toolchain").glob("*.json"))
    assert json.loads(saved.read_text()) == ident and ident["torch"] and ident["cxx"]


def test_counter(tmp_path: Path) -> None:
    assert [cache.bump_counter(tmp_path / "c" / "n.uses") for _ in range(3)] == [1, 2, 3]


def test_lean_retry_policy() -> None:
    assert not fast.lean_may_be_cause("main.cpp:2:44: error: expected ';' before '}' token")
    assert fast.lean_may_be_cause("main.cpp:2:10: error: 'matmul' is not a member of 'torch'")
    assert fast.lean_may_be_cause('cuda.cu(3): error: identifier "foo" is undefined')
    assert not fast.lean_may_be_cause("")  # no compiler error (a kill, a crash): nothing to retry


def test_binding_opt_level_follows_the_candidate(tmp_path: Path) -> None:
    fb = fast.FastBuilder(tmp_path, 10, 1, 1)
    assert "-O3" in fb.binding_flags(spec(extra_cflags=("-O2", "-O3", "-march=native")), False)
    default = fb.binding_flags(spec(), False)
    assert not any(f.startswith("-O") for f in default) and "-fvisibility=hidden" in default
    abi = fb.binding_flags(spec(extra_cflags=("-D_GLIBCXX_USE_CXX11_ABI=0", "-march=native", "-ffast-math")), False)
    assert "-D_GLIBCXX_USE_CXX11_ABI=0" in abi and "-march=native" not in abi and "-ffast-math" not in abi


def test_torch_flags_follow_the_installed_torch() -> None:
    tf = flags.torch_flags()
    assert tf.std.startswith("-std=c++") and "-fPIC" in tf.cxx_only
    assert "-DTORCH_API_INCLUDE_EXTENSION_H" in tf.common
    assert tf.ldflags[0] == "-shared" and "-ltorch_python" in tf.ldflags
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in tf.common)


def test_arch_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    assert flags.arch_gencode("9.0a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert flags.arch_gencode("8.6+PTX")[1] == "-gencode=arch=compute_86,code=compute_86"
    with pytest.raises(ValueError):
        flags.arch_gencode("sm_90")
    assert flags.resolve_cuda_arch("8.0") == "8.0"
    monkeypatch.setattr(flags, "_visible_gpu_capability", lambda: (9, 0))
    assert flags.resolve_cuda_arch(None) == "9.0a"
    monkeypatch.setattr(flags, "_visible_gpu_capability", lambda: (8, 6))
    assert flags.resolve_cuda_arch(None) == "8.6"
    monkeypatch.setattr(flags, "_visible_gpu_capability", lambda: None)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a;10.0")
    assert flags.resolve_cuda_arch(None) == "9.0a"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    with pytest.raises(ValueError):
        flags.resolve_cuda_arch(None)


def test_user_arch_flag_replaces_the_builders(tmp_path: Path) -> None:
    mine = flags.cuda_compile_flags(("-arch=sm_80",), "9.0a")
    assert not any(f.startswith("-gencode") for f in mine) and "-arch=sm_80" in mine
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags.cuda_compile_flags((), "9.0a")


def test_cpu_backend_rejects_cuda_without_compiling(builder: Builder) -> None:
    with pytest.raises(BuildError, match="cpu backend"):
        builder.build(spec(cuda_sources=("__global__ void k() {}",)))
    assert not (builder.cache_dir / "ext").exists()


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Builder(tmp_path, backend="tpu")
    with pytest.raises(ValueError):
        Builder(tmp_path, mode="slow")


def test_glue_text() -> None:
    text = glue.split_glue(("f", "ns::g"), "kx_0123")
    assert "PyInit_kx_0123" in text and "decltype(ns::g), 1" in text and '"f", "ns::g", nullptr' in text
    assert "names[] = {nullptr}" in glue.split_glue((), "kx_0123")
    assert glue.classic_binding(("f",)).splitlines()[1] == 'm.def("f", torch::wrap_pybind_function(f), "f");'
    assert "using kx_f0 = at::Tensor(at::Tensor);" in glue.binding_source(["at::Tensor(at::Tensor)"])
    assert glue.needs_pybind(("py::object f();",)) and not glue.needs_pybind((SRC,))


def _elf_with_section(name: bytes, payload: bytes) -> bytes:
    """A minimal ELF64 LE relocatable: null section, the payload section, .shstrtab."""
    shstr = b"\0" + name + b"\0.shstrtab\0"
    data_off = 64
    str_off = data_off + len(payload)
    sh_off = str_off + len(shstr)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    sections = bytes(64)
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, data_off, len(payload), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 2 + len(name), 3, 0, 0, str_off, len(shstr), 0, 0, 1, 0)
    return header + payload + shstr + sections


def test_read_signatures(tmp_path: Path) -> None:
    obj = tmp_path / "main.o"
    obj.write_bytes(_elf_with_section(b".kxsig", b"1\tat::Tensor(at::Tensor, double)\n\x000\tat::Tensor(at::Tensor)\n"))
    assert glue.read_signatures(obj, 2) == ["at::Tensor(at::Tensor)", "at::Tensor(at::Tensor, double)"]
    assert glue.read_signatures(obj, 3) is None
    obj.write_bytes(_elf_with_section(b".data", b"0\tx\n"))
    assert glue.read_signatures(obj, 1) is None


def test_generated_lean_headers() -> None:
    text = "#pragma once\n#include <ATen/Context.h>\n#include <ATen/ops/empty_ops.h>\nnamespace at {}\n"
    assert lean._strip_op_header(text) == "#pragma once\n#include <ATen/ops/empty_ops.h>\nnamespace at {}\n"
    deps = "x.o: x.cpp /usr/include/c++/12/vector \\\n /usr/include/c++/12/bits/stl_vector.h /usr/include/c++/12/cmath"
    assert lean._std_headers(deps) == ["cmath", "vector"]
