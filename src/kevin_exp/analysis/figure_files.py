"""The figures the analysis scripts write, each a PNG with the CSV of the numbers it plots: the test-time
scaling figure (Kevin Figs. 5-6) and the training curves, for the runs of an analysis."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from kevin_exp.analysis.cli import Analysis, write_output
from kevin_exp.analysis.curves import turn_curves
from kevin_exp.analysis.figures import scaling_figure, training_figure
from kevin_exp.analysis.loading import Run
from kevin_exp.analysis.training import training_curves


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


def write_figures(analysis: Analysis, out: Path) -> list[Path]:
    """``test_time_scaling`` and ``training_curves`` (PNG and CSV) under ``out``, where the runs hold their
    numbers; the paths written, PNGs first."""
    written = []
    scaling = turn_curves(analysis.variants, analysis.selection, analysis.bootstrap)
    if not scaling.empty:
        written += write_figure(out, "test_time_scaling", scaling, scaling_figure(scaling))
    training = training_curves(*run_labels(analysis))
    if not training.empty:
        written += write_figure(out, "training_curves", training, training_figure(training))
    return written
