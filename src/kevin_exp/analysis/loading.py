"""Turns command-line arguments (run directories, sweep directories, sweep names from the ledger) into runs:
each run's flattened config and its ``turns.jsonl`` / ``metrics.jsonl`` rows."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from kevin_exp.errors import UserError
from kevin_exp.records.ledger import ledger_entries
from kevin_exp.records.run_records import read_jsonl

DEFAULT_LEDGER = Path("outputs/ledger.jsonl")

# Used only when a run has no config.json: the turn-row columns that copy the run's config (an evaluation's
# rows also carry its own budget, eval_n_trajectories x eval_n_turns).
CONFIG_COLUMNS = ("gamma", "n_turns", "n_trajectories", "tasks_per_step", "normalization", "aggregation",
                  "estimator", "model", "seed", "experiment", "eval_n_trajectories", "eval_n_turns")


class NoRunsFound(UserError):
    """An argument named nothing that holds runs."""


@dataclass(frozen=True)
class Run:
    run_dir: Path
    config: dict[str, Any]
    """The resolved config, flattened to dotted keys (``algorithm.estimator``); lists are JSON strings."""
    rows: pd.DataFrame
    """``turns.jsonl``: one row per (step, task, trajectory, turn)."""
    metrics: pd.DataFrame
    """``metrics.jsonl``: one row per training step (empty when the file is missing)."""
    metrics_file: bool = False
    """Whether the run wrote ``metrics.jsonl`` (a run opens it when it starts, so a run that finished no step
    has it, empty)."""
    unreadable: dict[str, int] = field(default_factory=dict)
    """Lines of each file not read: the first cut line (a write cut short by a kill) and every line after it."""

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def planned_steps(self) -> int | None:
        steps = self.config.get("steps")
        return int(steps) if isinstance(steps, (int, float)) and not isinstance(steps, bool) else None

    def finished_train_steps(self) -> set[int] | None:
        """The training steps whose metrics row was appended (a step's last record, after its turn rows and its
        checkpoint); None when the run has no metrics.jsonl to tell (records written by hand), so its steps are
        taken as finished."""
        if not self.metrics_file:
            return None
        if self.metrics.empty or "step" not in self.metrics:
            return set()
        return {int(s) for s in self.metrics["step"].dropna()}


def flatten_config(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_config(value, dotted + "."))
        elif isinstance(value, (list, dict)):
            flat[dotted] = json.dumps(value, sort_keys=True)  # hashable, so runs can be grouped on it
        else:
            flat[dotted] = value
    return flat


def constant_columns(rows: pd.DataFrame, columns: Iterable[str] = CONFIG_COLUMNS) -> dict[str, Any]:
    """The value of each of ``columns`` that is the same in every row."""
    config = {}
    for column in columns:
        if column in rows and rows[column].nunique(dropna=False) == 1:
            value = rows[column].iloc[0]
            config[column] = value.item() if hasattr(value, "item") else value
    return config


def _read_rows(path: Path, unreadable: dict[str, int]) -> pd.DataFrame:
    rows = read_jsonl(path)
    if path.is_file():
        lines = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        if lines > len(rows):
            unreadable[path.name] = lines - len(rows)
    return pd.DataFrame(rows)


def load_run(run_dir: Path) -> Run:
    unreadable: dict[str, int] = {}
    rows = _read_rows(run_dir / "turns.jsonl", unreadable)
    metrics = _read_rows(run_dir / "metrics.jsonl", unreadable)
    config_path = run_dir / "config.json"
    if config_path.is_file():
        config = flatten_config(json.loads(config_path.read_text()))
    else:
        config = constant_columns(rows)
    return Run(run_dir=run_dir, config=config, rows=rows, metrics=metrics,
               metrics_file=(run_dir / "metrics.jsonl").is_file(), unreadable=unreadable)


def _runs_under(directory: Path) -> list[Path]:
    return sorted(d for d in directory.iterdir() if d.is_dir() and (d / "turns.jsonl").is_file())


def run_dirs_for(argument: str, ledger: Path = DEFAULT_LEDGER) -> list[Path]:
    """A run directory, a sweep directory (its depth-1 subfolders holding turns.jsonl), or a sweep name whose
    ledger entries give its sweep directory."""
    path = Path(argument)
    if path.is_dir():
        if (path / "turns.jsonl").is_file():
            return [path]
        runs = _runs_under(path)
        if not runs:
            raise NoRunsFound(f"{argument}: a directory with no turns.jsonl and no subfolder holding one")
        return runs
    if path.is_file():
        raise NoRunsFound(f"{argument}: a file; pass a run directory (it holds turns.jsonl), a sweep directory or "
                          "a sweep name")
    if not ledger.is_file():
        raise NoRunsFound(f"{argument}: not a run directory, not a sweep directory, and there is no ledger at "
                          f"{ledger} to look up a sweep of that name (--ledger names another)")
    entries = ledger_entries(ledger, sweep_name=argument)
    if not entries:
        raise NoRunsFound(f"{argument}: not a run directory, not a sweep directory, and no sweep of that name in "
                          f"the ledger {ledger}")
    sweep_dirs = list(dict.fromkeys(Path(e["sweep_dir"]) for e in entries if e.get("sweep_dir")))
    runs = [run for d in sweep_dirs if d.is_dir() for run in _runs_under(d)]
    if not runs:
        raise NoRunsFound(f"{argument}: the ledger {ledger} puts this sweep in "
                          f"{', '.join(map(str, sweep_dirs))}, which holds no run (no */turns.jsonl)")
    return runs


def load_runs(arguments: Iterable[str], ledger: Path = DEFAULT_LEDGER) -> list[Run]:
    dirs: list[Path] = []
    for argument in arguments:
        dirs.extend(run_dirs_for(argument, ledger))
    unique = list(dict.fromkeys(d.resolve() for d in dirs))
    if not unique:
        raise NoRunsFound("no run directory, sweep directory or sweep name given")
    return [load_run(d) for d in unique]
