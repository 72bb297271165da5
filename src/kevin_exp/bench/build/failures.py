"""Whose fault a failed build is: the candidate's sources (a compile error, kept and fed back) or the machine's
(a timeout under load, a compiler killed for memory, a missing tool, a sandbox that did not start: retried,
never kept, never fed back as the model's mistake).

A failure is the candidate's only when the compiler said so about the candidate's own files: an error
diagnostic located in (or instantiated from) ``main.cpp`` / ``cuda.cu``, or a link error about the candidate's
own symbols. Anything else is the machine's.
"""
from __future__ import annotations

import os
import re

from . import proc

SOURCE, INFRA, REFUSED = "source", "infra", "refused"
CANDIDATE_FILES = ("main.cpp", "cuda.cu", "binding.cpp")
_FILES = r"(?:\./)?(?:main\.cpp|cuda\.cu|binding\.cpp)"
# gcc: "main.cpp:12:5: error: ...", "main.cpp:3:10: fatal error: x.h: No such file"; nvcc (EDG): "cuda.cu(12): error"
_LOCATED_ERROR = re.compile(rf"^{_FILES}(?::\d+)+:\s*(?:fatal |internal compiler )?error\b|"
                            rf"^{_FILES}\(\d+\):\s*(?:catastrophic )?error\b", re.M)
# an error inside a header that the candidate's code instantiated: "main.cpp:12:5:   required from here"
_ANY_ERROR = re.compile(r"(?:^|\s)(?:fatal )?error\b|: error [A-Z]?\d*:", re.M)
_FROM_CANDIDATE = re.compile(rf"^\s*{_FILES}:\d+:\d+:\s+required from|^(?:In file included from|\s+from) {_FILES}:\d+",
                             re.M)
# ld about the candidate's own objects and symbols ("main.cpp:(.text+0x1a): undefined reference to `foo'")
_LINK_ERROR = re.compile(r"undefined reference|multiple definition")
_LINK_IN_CANDIDATE = re.compile(rf"(?:main|cuda\.cuda)\.o\b|{_FILES}:\(")
# the machine's, whatever else the output says
_MACHINE = re.compile(r"Killed signal terminated program|virtual memory exhausted|out of memory|"
                      r"cannot allocate memory|std::bad_alloc|No space left on device|cannot execute|"
                      r"cannot run |error trying to exec|Resource temporarily unavailable", re.I)
# a header the build itself puts first in every unit (glue.TORCH_PREFIX_CPP / _CUDA) was not found: torch's or CUDA's
# include folders are out of the compiler's sight (a path it cannot see), whatever the candidate wrote
_PREFIX_HEADER_MISSING = re.compile(r"^(?:\./)?(?:main\.cpp:1|cuda\.cu:[123]):\d+:\s*fatal error: "
                                    r"(?:torch/extension\.h|torch/types\.h|cuda\.h|cuda_runtime\.h): No such file", re.M)


def machine_failed(res: proc.ProcResult) -> bool:
    """Out of time, killed by a signal, out of memory or disk, a tool that could not run, or torch's or CUDA's own
    headers out of the compiler's sight."""
    return (res.timed_out or res.returncode < 0 or _MACHINE.search(res.output) is not None
            or _PREFIX_HEADER_MISSING.search(res.output) is not None)


def classify(res: proc.ProcResult) -> str:
    """``SOURCE`` or ``INFRA`` for a failed compiler or linker run of a candidate's build."""
    if machine_failed(res):
        return INFRA
    out = res.output
    if _LOCATED_ERROR.search(out) or (_ANY_ERROR.search(out) and _FROM_CANDIDATE.search(out)):
        return SOURCE
    if _LINK_ERROR.search(out) and _LINK_IN_CANDIDATE.search(out):
        return SOURCE
    return INFRA


def load_scale() -> float:
    """How much busier than its cores the machine is (1 when it is not): a retry's time limit is scaled by it."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


_COMMAND_LINE = re.compile(r"^\s*\$ |^\s*(?:\S*/)?(?:c\+\+|g\+\+|gcc|cc|nvcc|ld|python3?(?:\.\d+)?)\s+-", re.M)


def diagnostics(output: str) -> str:
    """The compiler's own lines, without command lines (the host's paths and flags are not the model's to see)."""
    return "\n".join(line for line in output.splitlines() if not _COMMAND_LINE.match(line))
