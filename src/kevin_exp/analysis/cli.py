"""What the analysis scripts share: the arguments that pick runs and rows, and turning them into variants."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from kevin_exp.analysis.bootstrap import BootstrapSettings
from kevin_exp.analysis.loading import DEFAULT_LEDGER, Run, load_runs
from kevin_exp.analysis.selection import SPLITS, StepWindow, choose_split
from kevin_exp.analysis.tables import Selection
from kevin_exp.analysis.variants import SEED_KEY, Variant, group_variants, varying_keys


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories, sweep directories, or sweep names from the ledger")
    parser.add_argument("--split", choices=SPLITS, help="default: eval when the runs have eval rows, else train")
    parser.add_argument("--steps", default="last",
                        help="last (each run's last step), all, or a:b (steps a..b, both included); default last")
    parser.add_argument("--turns", type=int, help="score over turns 1..N only (default: every turn present)")
    parser.add_argument("--ledger", type=Path, default=DEFAULT_LEDGER, help="sweep ledger (default %(default)s)")
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

    @property
    def shown_keys(self) -> list[str]:
        return [k for k in self.keys if k != SEED_KEY]


def analysis_from_args(args: argparse.Namespace) -> Analysis:
    """Raises ValueError (NoRunsFound included) with a message naming the bad argument."""
    if args.turns is not None and args.turns < 1:
        raise ValueError(f"--turns {args.turns}: expected 1 or more")
    runs = load_runs(args.runs, args.ledger)
    split, notes = choose_split(runs, args.split)
    used = [r for r in runs if not r.rows.empty and "split" in r.rows and (r.rows["split"] == split).any()]
    if not used:
        raise ValueError(f"no {split} rows in any of {', '.join(args.runs)}")
    keys = varying_keys(used)
    return Analysis(runs=used, keys=keys, variants=group_variants(used, keys),
                    selection=Selection(split, StepWindow.parse(args.steps), args.turns),
                    bootstrap=BootstrapSettings(n_resamples=args.resamples), notes=notes)
