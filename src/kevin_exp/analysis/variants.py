"""Which config keys a set of runs varies, and the variants they form: runs equal in every varying key but
``seed``, whose seeds are pooled."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Sequence

from kevin_exp.analysis.loading import Run

SEED_KEY = "seed"

# Keys that say where or how a run was launched, never what it computed; the same list the job directories
# ignore (conf/train.yaml hydra.job.config.override_dirname.exclude_keys), plus the compile cache location, how
# often checkpoints are written and kept, and what the records measure of a response (model.usual_opening).
NON_SCIENCE_KEYS = ("run_dir", "resume", "sweep_name", "logger.*", "resources.*", "cluster.*", "hydra.*",
                    "evaluator.cache_dir", "trainer.checkpoint_every", "trainer.state_every", "trainer.keep_checkpoints",
                    "trainer.keep_every", "model.usual_opening")

# Which weights an evaluation loaded: a column only where the training settings its rows record (seed
# included) do not already tell the checkpoints apart, as for two checkpoints of one training run.
IMPLIED_KEYS = ("checkpoint",)

_MISSING = "<missing>"


def _is_science(key: str) -> bool:
    return not any(fnmatch.fnmatchcase(key, pattern) for pattern in NON_SCIENCE_KEYS)


def _leaf(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def varying_keys(runs: Sequence[Run]) -> list[str]:
    """Science keys whose values differ between runs (``seed`` included), in config order.

    Aliases collapse to the shortest name: the config exposes headline knobs at top level and groups read them
    through interpolation (older runs record ``algorithm.gamma: ${gamma}``), so ``gamma`` and ``algorithm.gamma`` move
    together; a key is dropped when a shorter key with the same last component has the same value in every run.
    """
    keys = list(dict.fromkeys(k for run in runs for k in run.config))
    varying = [k for k in keys if _is_science(k) and len({repr(run.config.get(k, _MISSING)) for run in runs}) > 1]
    column = {k: tuple(repr(run.config.get(k, _MISSING)) for run in runs) for k in varying}
    kept = []
    for key in sorted(varying, key=lambda k: (k.count("."), len(k), k)):
        if not any(_leaf(other) == _leaf(key) and column[other] == column[key] for other in kept):
            kept.append(key)
    others = [k for k in varying if k in kept and k not in IMPLIED_KEYS]
    kept = [k for k in varying if k in kept and (k not in IMPLIED_KEYS or not _implied(column[k], others, column))]
    return [k for k in kept if not _named_by_its_group(k, kept, column)]


def _named_by_its_group(key: str, kept: Sequence[str], column: dict[str, tuple[str, ...]]) -> bool:
    """Whether ``key`` (``model.hidden_size``) follows from its group's ``name`` (``model.name``), which is kept:
    a model's shape keys would otherwise make a table of runs that differ in model 20 columns wide."""
    group = key.rpartition(".")[0]
    name = f"{group}.name"
    return bool(group) and key != name and name in kept and _implied(column[key], [name], column)


def _implied(values: tuple[str, ...], others: Sequence[str], column: dict[str, tuple[str, ...]]) -> bool:
    """Whether runs equal in every key of ``others`` are always equal in ``values``."""
    seen: dict[tuple[str, ...], str] = {}
    for run, value in enumerate(values):
        if seen.setdefault(tuple(column[k][run] for k in others), value) != value:
            return False
    return True


@dataclass(frozen=True)
class Variant:
    values: dict[str, Any]
    """The variant's value of each varying key (``seed`` excluded)."""
    runs: tuple[Run, ...]

    @property
    def seeds(self) -> list[Any]:
        return sorted({run.seed for run in self.runs}, key=repr)

    @property
    def label(self) -> str:
        if not self.values:
            return "all runs"
        return ", ".join(f"{k}={format_value(v)}" for k, v in self.values.items())


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    return str(value)


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, bool) or value is None:
        return (0, repr(value))
    if isinstance(value, (int, float)):
        return (1, value)
    return (2, str(value))


def group_variants(runs: Sequence[Run], keys: Sequence[str] | None = None) -> list[Variant]:
    """One variant per combination of the varying keys that occurs, sorted by the keys' values."""
    keys = varying_keys(runs) if keys is None else keys
    shown = [k for k in keys if k != SEED_KEY]
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(repr(run.config.get(k)) for k in shown), []).append(run)
    variants = [Variant({k: members[0].config.get(k) for k in shown}, tuple(members)) for members in groups.values()]
    return sorted(variants, key=lambda v: tuple(_sort_key(v.values[k]) for k in shown))
