"""OmegaConf resolvers the configs use (``kx.*``); registered before Hydra composes anything."""
from __future__ import annotations

import hashlib
import re
from typing import Any

from omegaconf import OmegaConf

_MAX_NAME = 120


def job_dir(override_dirname: str | None) -> str:
    """A job's directory name as a function of its overrides only (never the clock), so a resubmitted or
    restarted job finds its own records and checkpoints. No overrides: ``default``. Only letters, digits and
    ``._+-`` remain, so the path can be pasted into an override unquoted."""
    if not override_dirname:
        return "default"
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", override_dirname)
    if len(name) > _MAX_NAME:
        digest = hashlib.sha1(override_dirname.encode()).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11]}-{digest}"
    return name


def first_set(value: Any, fallback: Any) -> Any:
    return fallback if value in (None, "") else value


def heldout_split(suite: str) -> str:
    """The split an evaluation uses by default: Kevin's 20 held-out tasks of KernelBench; all of another suite."""
    return "kevin_holdout" if suite == "kernelbench" else "all"


def register_resolvers() -> None:
    for name, fn in (("kx.job_dir", job_dir), ("kx.or", first_set), ("kx.heldout_split", heldout_split)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
