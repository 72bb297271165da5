"""A sweep's report in one place: ``report.md`` with the PNGs and CSVs it embeds. It says how the runs were made
(command, ledger line, commit, versions, machines), the settings that vary and those that do not, Table 1 (and
Table 2 where the runs' budget allows one), the per-turn table, the test-time-scaling and training-curve
figures, each run's steps, time and its split, the reward-integrity counters, and what is missing."""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from kevin_exp.analysis.budget import budget_table
from kevin_exp.analysis.cli import (
    Analysis,
    ArgumentParser,
    add_selection_arguments,
    analysis_from_args,
    check_output_dir,
    write_output,
)
from kevin_exp.analysis.curves import curve_table, turn_curves
from kevin_exp.analysis.figure_files import run_labels, write_figures
from kevin_exp.analysis.render import render_markdown
from kevin_exp.analysis.run_facts import (
    integrity_table,
    missing_lines,
    provenance_lines,
    run_time_table,
    settings_lines,
    sweep_ledger_lines,
)
from kevin_exp.analysis.scores import trajectories_per_task, trajectory_scores
from kevin_exp.analysis.tables import Table, variant_table

REPORT_FILE = "report.md"
SECTIONS = ("How the runs were made", "Settings", "Table 1", "Table 2", "Per turn", "Figures", "Runs",
            "Reward integrity", "What is missing")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ArgumentParser(prog="analysis/report.py", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory for report.md and its figures")
    parser.add_argument("--budget", type=int, help="Table 2's kernels per task (default: the most every variant holds)")
    return parser.parse_args(argv)


def _largest_common_budget(analysis: Analysis) -> int | None:
    """The most kernels per task (k trajectories x n turns) that every variant's selected rows hold."""
    held = []
    for variant in analysis.variants:
        rows = analysis.selection.rows(variant)
        if not rows.empty:
            held.append(int(trajectories_per_task(trajectory_scores(rows)).min()) * int(rows["turn"].max()))
    return min(held) if held else None


def _table(table: Table) -> list[str]:
    return [render_markdown(table).replace("### ", "", 1)]


def report_text(analysis: Analysis, command: str, ledger: Path, figures: list[Path], budget: int | None) -> str:
    runs, labels, _ = run_labels(analysis)
    ledger_lines = sweep_ledger_lines(runs, ledger)
    selection = analysis.selection
    lines = [f"# Report: {', '.join(sorted({str(run.run_dir.parent) for run in runs}))}", "",
             f"{len(runs)} runs in {len(analysis.variants)} variants; made {time.strftime('%Y-%m-%d %H:%M %Z')} by "
             f"`{command}`.", "", f"## {SECTIONS[0]}", "", *provenance_lines(runs, ledger_lines), "",
             f"## {SECTIONS[1]}", "", *settings_lines(runs, analysis.keys), "",
             f"## {SECTIONS[2]}", "",
             *_table(variant_table(analysis.variants, selection, analysis.bootstrap, analysis.steps_text)),
             f"## {SECTIONS[3]}", ""]
    budget = budget if budget is not None else _largest_common_budget(analysis)
    table2 = budget_table(analysis.variants, selection, budget) if budget else None
    if table2 is not None and table2.rows:
        lines += _table(table2)
    else:
        lines += ["No fixed-budget table: " + ("; ".join(table2.notes) if table2 else "no rows in the window"), ""]
    curves = turn_curves(analysis.variants, selection, analysis.bootstrap)
    lines += [f"## {SECTIONS[4]}", "", *_table(curve_table(curves, analysis.shown_keys, selection)),
              f"## {SECTIONS[5]}", ""]
    pngs = [path for path in figures if path.suffix == ".png"]
    lines += [f"![{path.stem}]({path.name}) (numbers: [{path.stem}.csv]({path.stem}.csv))" for path in pngs]
    lines += ["", f"## {SECTIONS[6]}", "", *_table(run_time_table(runs, labels)),
              f"## {SECTIONS[7]}", "", *_table(integrity_table(runs, labels)),
              f"## {SECTIONS[8]}", "", *missing_lines(runs, analysis.variants, ledger_lines, analysis.notes), ""]
    return "\n".join(lines)


def write_report(analysis: Analysis, out: Path, command: str, ledger: Path, budget: int | None = None) -> Path:
    figures = write_figures(analysis, out)
    path = out / REPORT_FILE
    text = report_text(analysis, command, ledger, figures, budget)
    write_output(path, lambda p: p.write_text(text))
    return path


def main(argv: list[str] | None = None) -> Path:
    """``analysis/report.py``'s work; raises ``UserError`` on bad arguments or runs."""
    args = parse_args(argv)
    check_output_dir(args.out)
    analysis = analysis_from_args(args)
    command = shlex.join(["python", "analysis/report.py", *(sys.argv[1:] if argv is None else argv)])
    return write_report(analysis, args.out, command, args.ledger, args.budget)
