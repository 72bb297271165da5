"""Source rewriting and the split pybind11 binding.

torch's ``load_inline`` appends ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(...); }`` to the
C++ source, so every candidate pays for pybind11's templates. Instead the candidate unit gets a
small glue block that

* exports each bound function as an untyped pointer (``kx_fn_<i>``),
* records each function's exact type, as spelled by the compiler, in an ELF section ``.kxsig``,
* defines ``PyInit_<module>`` forwarding to ``kx_pyinit``,

and ``kx_pyinit`` lives in a *binding object* compiled from the recorded types only. Binding
objects are cached by signature list, so a candidate whose signatures were seen before links a
ready object; the binding code is torch's own (``m.def(name, torch::wrap_pybind_function(f),
name)``), so the module behaves the same.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

TORCH_PREFIX_CPP = "#include <torch/extension.h>"
TORCH_PREFIX_CUDA = ("#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>")
_PYBIND_LITERAL = re.compile(r"(PYBIND11_MODULE\s*\(\s*)([A-Za-z_]\w*)(\s*,)")
_NEEDS_PYBIND = re.compile(r"\bpybind11\b|\bpy::|\bPYBIND11_|\bPyObject\b|\bPy[A-Z]\w*\(")
NOT_A_FUNCTION = "!"


def rename_literal_module(source: str, spec_name: str) -> str:
    """`PYBIND11_MODULE(<spec.name>, m)` -> `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)`.

    torch compiles with -DTORCH_EXTENSION_NAME=<name>, so a literal equal to the spec's name is the
    same module; we rename modules per content, hence the rewrite. Other literals are left alone
    (torch fails to import those too).
    """
    return _PYBIND_LITERAL.sub(lambda m: m.group(1) + ("TORCH_EXTENSION_NAME" if m.group(2) == spec_name
                                                       else m.group(2)) + m.group(3), source)


def needs_pybind(sources: tuple[str, ...]) -> bool:
    return any(_NEEDS_PYBIND.search(s) for s in sources)


def cpp_source(sources: tuple[str, ...]) -> str:
    return "\n".join([TORCH_PREFIX_CPP, *sources])


def cuda_source(sources: tuple[str, ...]) -> str:
    return "\n".join([*TORCH_PREFIX_CUDA, *sources])


def classic_binding(functions: tuple[str, ...]) -> str:
    """Exactly what load_inline appends (with_pytorch_error_handling=True, docstring = name)."""
    lines = ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [f'm.def("{f}", torch::wrap_pybind_function({f}), "{f}");' for f in functions]
    return "\n".join([*lines, "}"])


_GLUE_HEAD = r"""
// ---- kevin_exp binding glue (see kevin_exp/bench/build/glue.py) ----
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>
namespace kx_glue {
template <class T> constexpr std::string_view type_name() {
  std::string_view p = __PRETTY_FUNCTION__;
  const std::size_t b = p.find("T = ") + 4;
  const std::size_t semi = p.find(';', b);  // gcc appends "; std::string_view = ..." to the list
  return p.substr(b, (semi == p.npos ? p.rfind(']') : semi) - b);
}
template <class T, std::size_t I> constexpr auto sig_entry() {
  constexpr std::string_view n = std::is_function_v<T> ? type_name<T>() : std::string_view("!");
  constexpr std::size_t digits = I < 10 ? 1 : I < 100 ? 2 : 3;
  std::array<char, digits + 1 + n.size() + 1> a{};
  std::size_t v = I;
  for (std::size_t k = digits; k-- > 0; v /= 10) a[k] = char('0' + v % 10);
  a[digits] = '\t';
  for (std::size_t k = 0; k < n.size(); ++k) a[digits + 1 + k] = n[k];
  a[digits + 1 + n.size()] = '\n';
  return a;
}
}  // namespace kx_glue
extern "C" void* kx_pyinit(const char* const* names, void* const* fns);
"""


def split_glue(functions: tuple[str, ...], module_name: str) -> str:
    out = [_GLUE_HEAD]
    for i, f in enumerate(functions):
        out.append(f'extern "C" __attribute__((visibility("hidden"))) void* const kx_fn_{i} = '
                   f"reinterpret_cast<void*>(&{f});")
        out.append(f'__attribute__((section(".kxsig"), used)) static constexpr auto kx_sig_{i} = '
                   f"kx_glue::sig_entry<decltype({f}), {i}>();")
    names = "".join(f'"{f}", ' for f in functions)
    fns = "".join(f"kx_fn_{i}, " for i in range(len(functions)))
    out.append(f'extern "C" __attribute__((visibility("default"))) void* PyInit_{module_name}(void) {{\n'
               f"  static const char* const names[] = {{{names}nullptr}};\n"
               f"  static void* const fns[] = {{{fns}nullptr}};\n"
               f"  return kx_pyinit(names, fns);\n}}")
    return "\n".join(out) + "\n"


def binding_source(signatures: list[str]) -> str:
    """The cached binding unit for one signature list (names and pointers come at import time)."""
    lines = [TORCH_PREFIX_CPP,
             "#if PYBIND11_VERSION_MAJOR < 3",
             "#error kx: the split binding needs pybind11 >= 3 (module name taken from the import spec)",
             "#endif",
             "namespace {",
             "const char* const* kx_names = nullptr;",
             "void* const* kx_fns = nullptr;"]
    lines += [f"using kx_f{i} = {sig};" for i, sig in enumerate(signatures)]
    lines += ["}  // namespace", "PYBIND11_MODULE(kx_binding, m) {"]
    lines += [f"m.def(kx_names[{i}], torch::wrap_pybind_function(reinterpret_cast<kx_f{i}*>(kx_fns[{i}])), "
              f"kx_names[{i}]);" for i in range(len(signatures))]
    lines += ["}",
              'extern "C" __attribute__((visibility("hidden"))) void* kx_pyinit(const char* const* names, '
              "void* const* fns) {",
              "  kx_names = names;",
              "  kx_fns = fns;",
              "  return PyInit_kx_binding();",
              "}"]
    return "\n".join(lines) + "\n"


def read_signatures(obj: Path, count: int) -> list[str] | None:
    """The ``.kxsig`` entries of an ELF64 object in function order, or None when absent/odd."""
    data = obj.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELF64 little-endian only
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size

    _, str_off, _ = section(shstrndx)
    blob = b""
    for i in range(shnum):
        name, off, size = section(i)
        end = data.index(b"\0", str_off + name)
        if data[str_off + name:end] == b".kxsig":
            blob += data[off:off + size]
    entries: dict[int, str] = {}
    for line in blob.replace(b"\0", b"").decode("utf-8", errors="replace").splitlines():
        idx, _, sig = line.partition("\t")
        if idx.isdigit():
            entries[int(idx)] = sig
    if sorted(entries) != list(range(count)):
        return None
    return [entries[i] for i in range(count)]
