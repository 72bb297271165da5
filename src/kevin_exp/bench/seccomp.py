"""A worker that has loaded candidate code may not create threads or processes, nor exec programs.

``forbid_new_tasks()`` is called by the candidate's worker after its warm-up (torch imported, its thread
pools started, the CUDA context up) and before the candidate's code is loaded.
"""
from __future__ import annotations


def forbid_new_tasks() -> None:
    """Install the filter on the calling process (inherited by every thread it already has)."""
    raise NotImplementedError("the seccomp filter is not implemented yet")
