"""Every field of an ``ExtensionSpec`` besides its sources, validated by type and pattern before anything compiles.

The names to bind and the module name are pasted into generated C++ (the binding glue, ``PyInit_<name>``,
``m.def("<name>", ...)``) that the native rules never read: a name is accepted only as a plain C identifier
that the candidate's own sources define, so nothing but that identifier reaches the compiler through it. Flags
go through the allow-list of ``user_flags``; include paths must name folders of the toolkit. The same checks
run on a spec folded from the candidate's text and on one only known at run time (the runner's build request),
and once more, on the final compiler input, in the builder (``compiler_input``).
"""
from __future__ import annotations

import os
import re
from dataclasses import fields
from typing import Any

from kevin_exp.bench.native_source import defined_functions, is_word, tokenize
from kevin_exp.bench.spec import ExtensionSpec

from . import proc, user_flags

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_FUNCTIONS = 64
# C++ keywords and alternative tokens: not names of functions
_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
    char32_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield
    decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto if
    inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
    template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq""".split())
_INCLUDE_PATH = re.compile(r"/[\w./+\-]{0,400}")
_STRING_FIELDS = ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                  "extra_include_paths")


def is_identifier(name: object) -> bool:
    return isinstance(name, str) and IDENTIFIER.fullmatch(name) is not None and name not in _KEYWORDS


def spec_from_request(payload: object) -> ExtensionSpec | str:
    """The spec a runner asks to build (a JSON object from a process that runs candidate code), or why it is not
    one: exactly the spec's fields, each of its declared type (no coercion)."""
    if not isinstance(payload, dict):
        return "the build request is not an object"
    names = {f.name for f in fields(ExtensionSpec)}
    unknown = set(payload) - names
    if unknown or "name" not in payload:
        return f"the build request has fields {sorted(map(str, unknown))[:5]} / lacks 'name'"
    kwargs: dict[str, Any] = {}
    for key, value in payload.items():
        if key == "name":
            if not isinstance(value, str):
                return "the build request's name is not a string"
            kwargs[key] = value
        elif key == "with_cuda":
            if value is not None and not isinstance(value, bool):
                return "the build request's with_cuda is not a boolean"
            kwargs[key] = value
        elif key == "functions" and value is None:
            kwargs[key] = None
        else:
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                return f"the build request's {key} is not a list of strings"
            kwargs[key] = tuple(value)
    return ExtensionSpec(**kwargs)


def _type_problems(spec: ExtensionSpec) -> list[str]:
    out = []
    if not isinstance(spec.name, str):
        out.append("the extension name is not a string")
    if spec.with_cuda is not None and not isinstance(spec.with_cuda, bool):
        out.append("with_cuda is not a boolean")
    for key in (*_STRING_FIELDS, "functions"):
        value = getattr(spec, key)
        if key == "functions" and value is None:
            continue
        if not isinstance(value, (tuple, list)) or not all(type(v) is str for v in value):
            out.append(f"{key} is not a list of strings")
    return out


def defined_names(spec: ExtensionSpec) -> set[str]:
    """Functions the sources define (``name(params) ... {``), and names they assign (``auto f = ...``)."""
    out: set[str] = set()
    for text in (*spec.cpp_sources, *spec.cuda_sources):
        toks = tokenize(text).tokens
        out |= defined_functions(toks)
        out |= {toks[k] for k in range(len(toks) - 2) if toks[k + 1] == "=" and toks[k + 2] != "=" and is_word(toks[k])}
    return out


def _toolkit_roots() -> list[str]:
    return [os.path.realpath(r) for r in proc.toolkit_roots()]


def include_path_problems(paths: tuple[str, ...]) -> list[str]:
    """An include path must be an absolute, plain path inside the toolkit (CUDA, torch, Python): those are the
    only folders a sandboxed compile sees, and headers elsewhere are not what the include rules judge."""
    bad = []
    roots = None
    for path in paths:
        if not _INCLUDE_PATH.fullmatch(path) or ".." in path.split("/"):
            bad.append(path)
            continue
        roots = roots if roots is not None else _toolkit_roots()
        real = os.path.realpath(path)
        if not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots):
            bad.append(path)
    return bad


def spec_problems(spec: ExtensionSpec) -> list[str]:
    """Why ``spec`` may not be built (empty: it may): types, the module name, the names to bind, flags, include
    paths. Each problem is one sentence the model can act on."""
    out = _type_problems(spec)
    if out:
        return out
    if not is_identifier(spec.name):
        out.append(f"the extension name {spec.name[:80]!r} is not a plain C identifier ([A-Za-z_][A-Za-z0-9_]*, at "
                   "most 128 characters)")
    if spec.functions is not None:
        bad = [f for f in spec.functions if not is_identifier(f)]
        if bad:
            out.append(f"functions: {', '.join(repr(f[:60]) for f in bad[:3])} "
                       f"{'is' if len(bad) == 1 else 'are'} not a plain C identifier; name each function to bind "
                       "exactly as the sources define it")
        elif len(spec.functions) > MAX_FUNCTIONS:
            out.append(f"functions: more than {MAX_FUNCTIONS} names to bind")
        elif len(set(spec.functions)) != len(spec.functions):
            out.append("functions: a name is listed twice")
        else:
            defined = defined_names(spec)
            missing = [f for f in spec.functions if f not in defined]
            if missing:
                out.append(f"functions: {', '.join(missing[:3])} {'is' if len(missing) == 1 else 'are'} not defined "
                           "in the extension's sources; every name to bind must be a function the sources define")
    bad_flags = user_flags.unsafe_flags(spec)
    if bad_flags:
        out.append(user_flags.describe(bad_flags))
    bad_paths = include_path_problems(spec.extra_include_paths)
    if bad_paths:
        out.append(f"extra_include_paths {', '.join(repr(p[:80]) for p in bad_paths[:3])} not allowed: only "
                   "absolute paths of folders of the CUDA toolkit, torch or Python")
    return out
