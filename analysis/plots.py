"""Figures for runs or a sweep, each written as a PNG with the CSV of the numbers it plots; in every panel the
variants (the config keys the runs vary; seeds pooled) are overlaid, one colour each, named in the legend:

- test_time_scaling.png/.csv: correctness and mean speedup against refinement turns (best@k of all k
  trajectories with its 95% bootstrap band, avg@k dashed) and against kernels per task (k x turns, the
  compute-matched view, one line per number k of parallel trajectories) (Kevin Figs. 5-6).
- training_curves.png/.csv: reward, correctness per turn, not-okay ratio, grad norm, loss and the time split of
  each training step, one line per run in its variant's colour (from metrics.jsonl, completed from
  turns.jsonl where it lacks a key).

    python analysis/plots.py outputs/sweeps/gamma_ablation --out figures/gamma
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import kevin_exp  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from kevin_exp.analysis.cli import (  # noqa: E402
    Analysis,
    ArgumentParser,
    add_selection_arguments,
    analysis_from_args,
    check_output_dir,
    write_output,
)
from kevin_exp.analysis.curves import turn_curves  # noqa: E402
from kevin_exp.analysis.figures import scaling_figure, training_figure  # noqa: E402
from kevin_exp.analysis.loading import Run  # noqa: E402
from kevin_exp.analysis.training import training_curves  # noqa: E402
from kevin_exp.errors import exits_on_user_error  # noqa: E402


def run_labels(analysis: Analysis) -> tuple[list[Run], list[str], list[str]]:
    """Each run, its label in the CSV (its variant and seed) and its variant's label."""
    runs, labels, variants = [], [], []
    for variant in analysis.variants:
        for run in variant.runs:
            runs.append(run)
            labels.append(f"{variant.label}, seed={run.seed}" if variant.values else f"seed={run.seed}")
            variants.append(variant.label)
    if len(runs) == 1:
        labels = [runs[0].name]
    elif len(set(labels)) < len(labels):
        labels = [f"{label} ({run.name})" for label, run in zip(labels, runs)]
    return runs, labels, variants


def write_figure(out: Path, name: str, data: pd.DataFrame, fig: Figure) -> list[Path]:
    csv, png = out / f"{name}.csv", out / f"{name}.png"
    write_output(csv, lambda path: data.to_csv(path, index=False))
    write_output(png, lambda path: fig.savefig(path, dpi=110))
    return [png, csv]


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory for the PNG and CSV files")
    args = parser.parse_args(argv)
    check_output_dir(args.out)
    analysis = analysis_from_args(args)
    for note in analysis.notes:
        print(f"note: {note}", file=sys.stderr)
    written = []
    scaling = turn_curves(analysis.variants, analysis.selection, analysis.bootstrap)
    if not scaling.empty:
        written += write_figure(args.out, "test_time_scaling", scaling, scaling_figure(scaling))
    training = training_curves(*run_labels(analysis))
    if not training.empty:
        written += write_figure(args.out, "training_curves", training, training_figure(training))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
