"""Kevin-style tables for runs or a sweep: one row per variant (the config keys the runs vary; seeds pooled),
then the fixed-budget view (--budget) and the per-turn scaling table.

    python analysis/ablation_table.py outputs/sweeps/gamma_ablation
    python analysis/ablation_table.py gamma_ablation --budget 128 --format latex --out gamma.tex
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import kevin_exp  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kevin_exp.analysis.budget import budget_table, check_budget
from kevin_exp.analysis.cli import (
    ArgumentParser,
    add_selection_arguments,
    analysis_from_args,
    check_output_file,
    write_output,
)
from kevin_exp.analysis.curves import curve_table, turn_curves
from kevin_exp.analysis.render import FORMATS, render
from kevin_exp.analysis.tables import variant_table
from kevin_exp.errors import exits_on_user_error


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="markdown")
    parser.add_argument("--budget", type=int,
                        help="also print the fixed-budget table for this many kernels per task (k trajectories x n "
                             "turns); a budget the runs cannot fill is named in a note")
    parser.add_argument("--no-turns", action="store_true", help="leave out the per-turn table")
    parser.add_argument("--out", type=Path, help="write the tables here instead of stdout")
    return parser.parse_args(argv)


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.budget is not None:
        check_budget(args.budget)
    if args.out:
        check_output_file(args.out)
    analysis = analysis_from_args(args)
    notes = list(analysis.notes)
    tables = [variant_table(analysis.variants, analysis.selection, analysis.bootstrap, analysis.steps_text)]
    if args.budget is not None:
        budget = budget_table(analysis.variants, analysis.selection, args.budget)
        if budget.rows:
            tables.append(budget)
        else:  # no variant fits the budget: the notes say why and which budgets fit
            notes += budget.notes
    if not args.no_turns:
        curves = turn_curves(analysis.variants, analysis.selection, analysis.bootstrap)
        tables.append(curve_table(curves, analysis.shown_keys, analysis.selection))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    text = "\n".join(render(table, args.format) for table in tables)
    if args.out:
        write_output(args.out, lambda path: path.write_text(text))
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
