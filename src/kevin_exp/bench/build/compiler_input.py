"""The last gate before a compiler starts: what it is about to read, as it will read it.

The native rules judge the candidate's sources; the builder then pastes other text into what it compiles (the
names to bind and the module name into the binding glue, type spellings read back from the candidate's object
into the cached binding unit, flags and include paths onto command lines). Here, right before each compiler or
linker process of a candidate's build starts, the generated file must be exactly the checked sources plus glue
made from plain identifiers, every type spelling must be a type and nothing else, and every argument must be
either the builder's own or one of the candidate's allow-listed flags. Anything else is refused (``Refused``),
never compiled.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from kevin_exp.bench.spec import ExtensionSpec

from . import glue, spec_check, user_flags

MODULE = re.compile(r"kx_[0-9a-f]{16}")
# a type as g++ spells it: names, ::, template brackets, pointers, references, function and array parentheses
# (no braces, quotes, semicolons, '=', '#' or comments: nothing that can start a declaration or carry code)
_SIGNATURE = re.compile(r"[\w:<>,&*() .\[\]]{1,2000}")


class Refused(Exception):
    """What a compiler was about to read is not what the checks allowed."""


def check_names(functions: Iterable[str], module: str) -> None:
    bad = [f for f in functions if not spec_check.is_identifier(f)]
    if bad:
        raise Refused(f"the names to bind {bad[:3]!r} are not plain C identifiers; nothing was compiled")
    if not MODULE.fullmatch(module):
        raise Refused(f"the module name {module!r} is not one the builder makes; nothing was compiled")


def check_signatures(signatures: list[str]) -> None:
    """Type spellings read back from the candidate's object (its ``.kxsig`` section, which its sources can also
    write) before they are pasted into the binding unit."""
    for sig in signatures:
        if sig == glue.NOT_A_FUNCTION:
            continue
        if not _SIGNATURE.fullmatch(sig) or sig.count("(") != sig.count(")") or sig.count("[") != sig.count("]"):
            raise Refused(f"a function type read back from the compiled sources is not a plain type ({sig[:80]!r}); "
                          "nothing more was compiled")


def expected_cpp(spec: ExtensionSpec, module: str, binding: str) -> str:
    """main.cpp as the builder makes it: the checked sources, then the glue (``binding``: split, classic, none)."""
    cpp = tuple(glue.rename_literal_module(s, spec.name) for s in spec.cpp_sources)
    if binding == "none" or spec.functions is None:
        return glue.cpp_source(cpp)
    check_names(spec.functions, module)
    tail = glue.split_glue(spec.functions, module) if binding == "split" else glue.classic_binding(spec.functions)
    return glue.cpp_source(cpp) + "\n" + tail


def check_unit(path: Path, spec: ExtensionSpec, module: str) -> None:
    """The generated source at ``path`` (main.cpp or cuda.cu) is exactly what the checks allowed."""
    text = path.read_text()
    if path.name == "cuda.cu":
        cu = tuple(glue.rename_literal_module(s, spec.name) for s in spec.cuda_sources)
        allowed = [glue.cuda_source(cu)]
    else:
        allowed = [expected_cpp(spec, module, b) for b in ("split", "classic", "none")]
    if text not in allowed:
        raise Refused(f"{path.name} holds text that is neither the checked sources nor the binding glue made from "
                      "their names; nothing was compiled")


def user_arguments(spec: ExtensionSpec, tool: str) -> list[str]:
    """The arguments a candidate's spec puts on ``tool``'s command line ("g++", "nvcc" or "link")."""
    includes = [f"-I{os.path.abspath(p)}" for p in spec.extra_include_paths]
    if tool == "g++":
        return [*includes, *spec.extra_cflags]
    if tool == "nvcc":
        return [*includes, *spec.extra_cuda_cflags]
    return list(spec.extra_ldflags)


def check_argv(argv: list[str], trusted: Iterable[str], spec: ExtensionSpec | None, tool: str) -> None:
    """Every argument is the builder's own (``trusted``: torch's flags, the cache's folders, file names) or one of
    the candidate's flags, and those pass the allow-list."""
    if spec is not None:
        problems = user_flags.unsafe_flags(spec) + spec_check.include_path_problems(spec.extra_include_paths)
        if problems:
            raise Refused(f"{tool}: {user_flags.describe(problems)}")
    allowed = set(trusted) | set(user_arguments(spec, tool) if spec is not None else ())
    foreign = [a for a in argv if a not in allowed]
    if foreign:
        raise Refused(f"{tool}: arguments {[a[:80] for a in foreign[:3]]!r} come from neither the builder nor the "
                      "candidate's allowed flags; nothing was compiled")
