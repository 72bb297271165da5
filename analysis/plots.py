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

from kevin_exp.analysis.cli import (  # noqa: E402
    ArgumentParser,
    add_selection_arguments,
    analysis_from_args,
    check_output_dir,
)
from kevin_exp.analysis.figure_files import write_figures  # noqa: E402
from kevin_exp.errors import exits_on_user_error  # noqa: E402


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
    for path in write_figures(analysis, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
