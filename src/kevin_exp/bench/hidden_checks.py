"""Hidden checks, as the parent sees them: extra checked calls whose inputs the prompt never shows (other scales and
distributions of the problem's floating inputs, a hidden size of the problem), so a kernel that is right only on
the inputs it is shown (a strided subsample, a closed form fitted to N(0,1), a normalisation that passes as the
identity, loop bounds written as constants) is ``incorrect``. The inputs are drawn in the reference process
(``worker/input_variants.py``); the feedback on a failure names neither the shape nor the distribution.

A hidden check is a call kind ``hidden:<name>`` in ``protocol.schedule``: checked in full like a correctness
trial, untimed, its inputs staged through the shared region (never from a seed the runner could redraw).
"""
from __future__ import annotations

from typing import Any

# each floating input scaled by 1e-3 / 1e3; Cauchy (clipped) around the input's mean and spread; the input with
# about one element in a thousand replaced by a spike a hundred times its largest magnitude
DISTRIBUTIONS = ("scale_small", "scale_large", "heavy_tail", "spikes")
HIDDEN_SHAPE = "hidden_shape"
PREFIX = "hidden:"

FEEDBACK = ("incorrect on a hidden check: your output is wrong for inputs of the problem's form that the prompt "
            "does not show (the evaluator also checks other values and sizes of the inputs); the kernel must be "
            "right for any inputs, not only for the ones it is shown")


DURING = ("on a hidden check (inputs of the problem's form that the prompt does not show; the evaluator also checks "
          "other values and sizes of the inputs)")


def enabled(config: Any) -> list[str]:
    """The hidden checks the settings ask for, in the order they run."""
    names = list(DISTRIBUTIONS) if config.check_distributions else []
    return names + ([HIDDEN_SHAPE] if config.hidden_shape_check else [])


def kind(name: str) -> str:
    return PREFIX + name


def is_hidden(kind_: str) -> bool:
    return kind_.startswith(PREFIX)


def name_of(kind_: str) -> str:
    return kind_.removeprefix(PREFIX)


def is_checked(kind_: str) -> bool:
    """Calls whose whole output (and inputs after the call) the reference compares: correctness and hidden checks."""
    return kind_ == "check" or is_hidden(kind_)


def variants(kinds: list[str], start: int) -> dict[str, str]:
    """The hidden calls among ``kinds`` (calls ``start``...), as the reference's chunk request names them."""
    return {str(start + k): name_of(x) for k, x in enumerate(kinds) if is_hidden(x)}


def new_record(config: Any, prepared: dict[str, Any]) -> dict[str, Any]:
    """What the verdict says of the hidden checks (``extra["hidden_checks"]``): asked, available, skipped and why."""
    offered = prepared.get("hidden") or {}
    return {"enabled": enabled(config), "available": list(offered.get("checks", [])),
            "skipped": dict(offered.get("skipped", {})), "passed": [], "failed": None}
