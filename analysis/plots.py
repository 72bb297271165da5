"""Figures for runs or a sweep, each written as a PNG with the CSV of the numbers it plots:

- test_time_scaling.png/.csv: correctness and mean speedup (best@k, with avg@k dashed) against refinement
  turns, one line per number k of parallel trajectories, and the compute-matched view (x = k x turns kernels);
  one row of panels per variant, bands are 95% bootstrap intervals (Kevin Figs. 5-6).
- training_curves.png/.csv: reward, correctness per turn, not-okay ratio, grad norm, loss and the time split of
  each training step, one line per run (from metrics.jsonl, completed from turns.jsonl where it lacks a key).

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

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from kevin_exp.analysis.cli import Analysis, add_selection_arguments, analysis_from_args  # noqa: E402
from kevin_exp.analysis.curves import turn_curves  # noqa: E402
from kevin_exp.analysis.training import turn_columns, training_curves  # noqa: E402

SCALING_PANELS = (("correct", "turn", "correctness"), ("speedup", "turn", "mean speedup (x)"),
                  ("correct", "kernels", "correctness"), ("speedup", "kernels", "mean speedup (x)"))
TIME_STYLES = {"generate_s": "-", "evaluate_s": "--", "train_s": ":"}


def plot_test_time_scaling(curves: pd.DataFrame, path: Path) -> None:
    variants = list(dict.fromkeys(curves["variant"]))
    fig, axes = plt.subplots(len(variants), len(SCALING_PANELS), figsize=(17, 3.4 * len(variants)), squeeze=False)
    colors = plt.get_cmap("viridis")
    for row, variant in zip(axes, variants):
        data = curves[curves["variant"] == variant]
        ks = sorted(data["k"].unique())
        for ax, (metric, x, ylabel) in zip(row, SCALING_PANELS):
            for i, k in enumerate(ks):
                line = data[data["k"] == k].sort_values("turn")
                color = colors(i / max(1, len(ks) - 1))
                ax.plot(line[x], line[f"{metric}_best"], marker="o", color=color, label=f"best@{k}")
                ax.fill_between(line[x], line[f"{metric}_best_lo"], line[f"{metric}_best_hi"], color=color, alpha=0.15)
            if x == "turn":
                avg = data[data["k"] == ks[0]].sort_values("turn")  # avg@k is the same for every k
                ax.plot(avg["turn"], avg[f"{metric}_avg"], "k--", label="avg@k")
                ax.set_xticks(sorted(data["turn"].unique()))
            else:
                ax.set_xscale("log", base=2)
            ax.set_xlabel("refinement turns" if x == "turn" else "kernels per task (k x turns)")
            ax.set_ylabel(ylabel)
            view = f"{ylabel} vs {'turns' if x == 'turn' else 'kernels (compute-matched)'}"
            ax.set_title(f"{variant}\n{view}" if ax is row[0] else view, fontsize=9)
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_training_curves(curves: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    runs = list(dict.fromkeys(curves["run"]))
    colors = plt.get_cmap("tab10")
    per_turn = turn_columns(curves.columns)
    panels = [("reward_mean", "reward (mean; max dotted)"), (None, "correctness per turn"),
              ("not_okay_ratio", "not-okay ratio"), ("grad_norm", "grad norm"), ("loss", "loss"),
              (None, "time per step (s)")]
    for ax, (column, title) in zip(axes.flat, panels):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for i, run in enumerate(runs):
        data = curves[curves["run"] == run].sort_values("step")
        color = colors(i % 10)
        for ax, (column, _) in zip(axes.flat, panels):
            if column is not None and column in data and data[column].notna().any():
                ax.plot(data["step"], data[column], color=color, marker=".", label=run if ax is axes[0, 0] else None)
        if "reward_max" in data:
            axes[0, 0].plot(data["step"], data["reward_max"], color=color, linestyle=":")
        for j, column in enumerate(per_turn):
            axes[0, 1].plot(data["step"], data[column], color=color, alpha=1.0 - 0.6 * j / max(1, len(per_turn)),
                            marker=".", label=f"{run}, turn {j + 1}" if len(runs) == 1 else None)
        for column, style in TIME_STYLES.items():
            if column in data:
                axes[1, 2].plot(data["step"], data[column], color=color, linestyle=style,
                                label=column.removesuffix("_s") if i == 0 else None)
    for ax in axes.flat:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.has_data():
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_labels(analysis: Analysis) -> tuple[list, list[str]]:
    runs, labels = [], []
    for variant in analysis.variants:
        for run in variant.runs:
            runs.append(run)
            labels.append(f"{variant.label}, seed={run.seed}" if variant.values else f"seed={run.seed}")
    if len(runs) == 1:
        labels = [runs[0].name]
    elif len(set(labels)) < len(labels):
        labels = [f"{label} ({run.name})" for label, run in zip(labels, runs)]
    return runs, labels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory for the PNG and CSV files")
    args = parser.parse_args(argv)
    try:
        analysis = analysis_from_args(args)
        scaling = turn_curves(analysis.variants, analysis.selection, analysis.bootstrap)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for note in analysis.notes:
        print(f"note: {note}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    if not scaling.empty:
        scaling.to_csv(args.out / "test_time_scaling.csv", index=False)
        plot_test_time_scaling(scaling, args.out / "test_time_scaling.png")
        written += ["test_time_scaling.png", "test_time_scaling.csv"]
    training = training_curves(*run_labels(analysis))
    if not training.empty:
        training.to_csv(args.out / "training_curves.csv", index=False)
        plot_training_curves(training, args.out / "training_curves.png")
        written += ["training_curves.png", "training_curves.csv"]
    for name in written:
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
