"""What the analysis scripts share: the arguments that pick runs and rows, turning them into variants, and
writing the results where --out says."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

from kevin_exp.analysis.bootstrap import BootstrapSettings
from kevin_exp.analysis.loading import DEFAULT_LEDGER, Run, load_runs
from kevin_exp.analysis.selection import (
    SPLITS,
    StepWindow,
    choose_split,
    completeness_notes,
    leave_out_partial_steps,
    runs_of_split,
    steps_present,
    steps_text,
    steps_used,
    steps_used_text,
)
from kevin_exp.analysis.tables import Selection
from kevin_exp.analysis.variants import SEED_KEY, Variant, group_variants, varying_keys
from kevin_exp.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """Bad arguments raise ``UserError`` (one ``error:`` line, exit status 2) instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories, sweep directories, or sweep names from the ledger")
    parser.add_argument("--split", choices=SPLITS, help="default: eval when the runs have eval rows, else train")
    parser.add_argument("--steps", default="last",
                        help="last (each run's last step), all, or a:b (steps a..b, both included; the first "
                             "training step is 1); default last")
    parser.add_argument("--turns", type=int, help="score over turns 1..N only (default: every turn present)")
    parser.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER, help="sweep ledger (default %(default)s)")
    parser.add_argument("--include-partial", action="store_true",
                        help="keep training steps a run stopped inside (turn rows without the step's metrics row); "
                             "by default they are left out and named in a note")
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default %(default)s)")


@dataclass(frozen=True)
class Analysis:
    runs: list[Run]
    keys: list[str]
    """The varying config keys, ``seed`` included."""
    variants: list[Variant]
    selection: Selection
    bootstrap: BootstrapSettings
    notes: list[str]
    steps_used: dict[str, list[int]]
    """The steps each run contributes to the window."""

    @property
    def steps_text(self) -> str:
        return steps_used_text(self.steps_used)

    @property
    def shown_keys(self) -> list[str]:
        return [k for k in self.keys if k != SEED_KEY]


def analysis_from_args(args: argparse.Namespace) -> Analysis:
    """Raises ``UserError`` (``NoRunsFound`` included) with a message naming the bad argument."""
    if args.turns is not None and args.turns < 1:
        raise UserError(f"--turns {args.turns}: expected 1 or more")
    if args.resamples < 0:
        raise UserError(f"--resamples {args.resamples}: expected 0 (no intervals) or more")
    window = StepWindow.parse(args.steps)
    runs = load_runs(args.runs, args.ledger)
    split, notes = choose_split(runs, args.split)
    used = runs_of_split(runs, split)
    if not used:
        named = ", ".join(args.runs)
        if args.split:
            raise UserError(f"--split {split}: no {split} rows in any of {named}")
        empty = all(r.rows.empty for r in runs)
        detail = "their turns.jsonl files hold no rows" if empty else "no row is of either split"
        raise UserError(f"no train or eval rows in any of {named}: {detail}")
    notes += [note for run in used for note in completeness_notes(run)]
    used, partial = leave_out_partial_steps(used, split, args.include_partial)
    notes += partial
    keys = varying_keys(used)
    variants = group_variants(used, keys)
    selection = Selection(split, window, args.turns)
    selected = [selection.rows(v) for v in variants]
    if all(rows.empty for rows in selected):
        raise UserError(f"--steps {args.steps}: no {split} rows in that window; the runs hold {split} rows of "
                        f"steps {steps_text(steps_present(used, split))}")
    most_turns = max(int(rows["turn"].max()) for rows in selected if not rows.empty)
    if args.turns is not None and args.turns > most_turns:
        notes.append(f"--turns {args.turns}: the {split} rows hold at most {most_turns} turns; scored over those")
    return Analysis(runs=used, keys=keys, variants=variants, selection=selection,
                    bootstrap=BootstrapSettings(n_resamples=args.resamples), notes=notes,
                    steps_used=steps_used(used, split, window))


def _check_creatable(directory: Path, flag: str, named: Path) -> None:
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"{flag} {named}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {named}: {existing} is not writable")


def check_output_dir(path: Path, flag: str = "--out") -> None:
    """Fails early, before any work, when the directory ``path`` cannot be created or written to."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: a file, not a directory; name a directory")
    _check_creatable(path, flag, path)


def check_output_file(path: Path, flag: str = "--out") -> None:
    """Fails early, before any work, when the file ``path`` cannot be written."""
    if path.is_dir():
        raise UserError(f"{flag} {path}: a directory; name a file")
    _check_creatable(path.parent, flag, path)


def write_output(path: Path, write: Callable[[Path], object], flag: str = "--out") -> None:
    """``write(path)`` after creating its directory; an ``OSError`` (disk full, permissions) becomes a
    ``UserError`` naming ``path``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as error:
        raise UserError(f"{flag} {path}: cannot write there ({error.strerror or error})") from None
