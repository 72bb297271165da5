"""Trimming compiler and runtime output to what fits in a model's next prompt, and keeping other files out of it.

Feedback quotes only the candidate's own sources (relative paths in its build folder: ``main.cpp``,
``cuda.cu``) and the toolkit's headers (the compiler's, CUDA's, torch's, Python's, the lean headers, the
build caches). A diagnostic located in any other file (``#include "/etc/passwd"`` makes the compiler quote
its first line) is replaced by a note, with its source excerpt and the include chain that leads to it.
"""
from __future__ import annotations

import functools
import os
import re

_ERROR_LINE = re.compile(r"\berror\b|Error|error:", re.IGNORECASE)
_NOISE = re.compile(r"^\s*(\[\d+/\d+\]|ninja: |FAILED: |c\+\+ |g\+\+ |/usr/\S*nvcc |nvcc )")

# gcc/clang: "path:12:5: error: ...", "path:12: ...", "path: In function 'f':"; nvcc (EDG): "path(12): error: ..."
_LOCATED = re.compile(r"^(?P<path>[^\s:()|][^:()]*?)(?::\d+(?::\d+)?:|\(\d+\):|: (?:In |At ))")
_INCLUDED = re.compile(r"^(?:In file included from|\s+from) (?P<path>[^\s:][^:]*?):\d+(?::\d+)?[:,]")
# a source excerpt line: "   12 | code", "      |   ^~~", "  +++ |+#include <x>"
_EXCERPT = re.compile(r"^\s*(\d+|\+\+\+)?\s*\|")
REMOVED_NOTE = "[a diagnostic in a file outside your sources was removed]"
_PSEUDO_FILES = ("<command-line>", "<built-in>", "<stdin>")


@functools.lru_cache(maxsize=1)
def _toolkit_roots() -> tuple[str, ...]:
    """Folders whose headers a diagnostic may quote: the compiler's, CUDA's, torch's, Python's, the lean headers."""
    import sysconfig

    roots = ["/usr/include", "/usr/lib/gcc", "/usr/local/include", "/usr/local/cuda"]
    try:
        from torch.utils.cpp_extension import include_paths

        # the build's modules only here: verdict reads this module, and `import kevin_exp.bench` stays light
        from kevin_exp.bench.build.flags import LEAN_HEADERS_DIR, cuda_home

        roots += [*include_paths(), str(LEAN_HEADERS_DIR)]
        if cuda_home():
            roots.append(str(cuda_home()))
    except Exception:  # noqa: BLE001 - without torch, the fixed roots stay
        pass
    roots += [p for p in (sysconfig.get_paths().get("include"), sysconfig.get_paths().get("platinclude")) if p]
    return tuple(sorted({os.path.realpath(r) for r in roots}))


def allowed_roots() -> tuple[str, ...]:
    from kevin_exp.bench.build import proc  # (not at import: see _toolkit_roots)

    return (*_toolkit_roots(), *(str(p) for p in sorted(proc.readable_roots())))


def quotable(path: str, roots: tuple[str, ...]) -> bool:
    path = path.strip()
    if path in _PSEUDO_FILES:
        return True
    if not path.startswith("/"):
        return ".." not in path.split("/")  # the candidate's own files, in its build folder
    real = os.path.normpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def drop_foreign_quotes(log: str, roots: tuple[str, ...] | None = None) -> str:
    """``log`` without the diagnostics (and their excerpts and include chains) located in files outside ``roots``
    and the candidate's own sources."""
    roots = allowed_roots() if roots is None else roots
    out: list[str] = []
    dropping = False
    for line in log.splitlines():
        m = _INCLUDED.match(line) or _LOCATED.match(line)
        if m is not None:
            dropping = not quotable(m.group("path"), roots)
        if dropping:  # the diagnostic and everything up to the next located line (excerpt, carets, continuation)
            if not out or out[-1] != REMOVED_NOTE:
                out.append(REMOVED_NOTE)
            continue
        out.append(line)
    return "\n".join(out)


def trim_compiler_log(log: str, limit: int) -> str:
    """Keep the first error lines with a little context, drop command lines and paths noise and quotes of other files."""
    log = drop_foreign_quotes(log)
    lines = [ln for ln in log.splitlines() if ln.strip() and not _NOISE.match(ln)]
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            for ctx in lines[i : i + 3]:
                if ctx not in picked:
                    picked.append(ctx)
        if sum(len(p) + 1 for p in picked) > limit:
            break
    text = "\n".join(picked or lines[-20:])
    return trim(text, limit)


def trim(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + "\n[... trimmed ...]\n" + text[-(limit - head - 20) :]
