"""The figures analysis/plots.py writes, as matplotlib Figures (no pyplot state): one axes per metric, every
variant overlaid in it in its own colour and named in its legend."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator

from kevin_exp.analysis.training import turn_columns

SCALING_METRICS = (("correct", "correctness"), ("speedup", "mean speedup (x)"))
K_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
TRAINING_PANELS = (("reward_mean", "reward (mean; max dotted)"),
                   (None, "correct per turn (lighter: earlier turns); dashed: best turn faster than PyTorch"),
                   ("not_okay_ratio", "not-okay ratio"),
                   ("grad_norm", "grad norm"), ("loss", "loss"),
                   (None, "time per step (s): generate solid, evaluate dashed, train dotted"))
TIME_STYLES = {"generate_s": "-", "evaluate_s": "--", "train_s": ":"}
NOT_SHOWN = {"not-okay ratio": "not measured: these models have no usual opening (model.usual_opening)"}


def variant_colors(variants: Sequence[str]) -> dict[str, Any]:
    palette = colormaps["tab10"]
    return {variant: palette(i % 10) for i, variant in enumerate(variants)}


def floor_at_zero(ax: Axes) -> None:
    """Starts the y axis at 0 when nothing plotted is negative (all-zero data would otherwise be centred on 0,
    on an axis from -0.055 to 0.055); all-zero data gets 0 to 1."""
    values = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()] or [np.zeros(0)])
    values = values[np.isfinite(values)]
    if values.size and values.min() >= 0:
        ax.set_ylim(0, 1 if values.max() == 0 else None)


def _variant_legend(ax: Axes, variants: Sequence[str], colors: dict[str, Any]) -> None:
    handles = [Line2D([], [], color=colors[v], marker="o") for v in variants]
    ax.legend(handles, variants, fontsize=7)


def scaling_figure(curves: pd.DataFrame) -> Figure:
    """``turn_curves`` rows as Kevin Figs. 5-6: per metric, best@k of all k trajectories (band: 95% CI) and avg@k
    (dashed) against refinement turns, and best@k against kernels per task (k x turns, one line per k)."""
    variants = list(dict.fromkeys(curves["variant"]))
    colors = variant_colors(variants)
    markers = {k: K_MARKERS[i % len(K_MARKERS)] for i, k in enumerate(sorted(curves["k"].unique()))}
    fig = Figure(figsize=(13, 9), layout="constrained")
    axes = fig.subplots(2, len(SCALING_METRICS), squeeze=False)
    for (by_turn, by_kernels), (metric, ylabel) in zip(axes.T, SCALING_METRICS):
        for variant in variants:
            data, color = curves[curves["variant"] == variant], colors[variant]
            line = data[data["k"] == data["k"].max()].sort_values("turn")
            by_turn.plot(line["turn"], line[f"{metric}_best"], marker="o", color=color, label=variant)
            by_turn.fill_between(line["turn"], line[f"{metric}_best_lo"], line[f"{metric}_best_hi"], color=color,
                                 alpha=0.15)
            by_turn.plot(line["turn"], line[f"{metric}_avg"], color=color, linestyle="--")
            for k, per_k in data.groupby("k"):
                per_k = per_k.sort_values("turn")
                by_kernels.plot(per_k["kernels"], per_k[f"{metric}_best"], color=color, marker=markers[k])
        by_turn.set_xticks(sorted(curves["turn"].unique()))
        by_turn.set_xlabel("refinement turns")
        by_turn.set_title(f"{ylabel}: best@k of all k trajectories (band: 95% CI), avg@k dashed", fontsize=9)
        by_kernels.set_xscale("log", base=2)
        by_kernels.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        by_kernels.set_xlabel("kernels per task (k trajectories x turns)")
        by_kernels.set_title(f"{ylabel}: best@k against kernels (compute-matched), one line per k", fontsize=9)
        k_handles = [Line2D([], [], color="gray", marker=m, linestyle="") for m in markers.values()]
        by_kernels.add_artist(by_kernels.legend(k_handles, [f"k={k}" for k in markers], fontsize=7, loc="lower right"))
        for ax in (by_turn, by_kernels):
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            floor_at_zero(ax)
            _variant_legend(ax, variants, colors)
    return fig


def training_figure(curves: pd.DataFrame) -> Figure:
    """``training_curves`` rows: one axes per metric against the training step, each run in its variant's colour."""
    variants = list(dict.fromkeys(curves["variant"]))
    colors = variant_colors(variants)
    per_turn = turn_columns(curves.columns)
    fig = Figure(figsize=(17, 9), layout="constrained")
    axes = list(fig.subplots(2, 3).flat)
    shown: list[list[str]] = [[] for _ in axes]

    def plot(panel: int, data: pd.DataFrame, column: str, variant: str, **style: Any) -> None:
        if column in data and data[column].notna().any():
            axes[panel].plot(data["step"], data[column], color=colors[variant], **style)
            if variant not in shown[panel]:
                shown[panel].append(variant)

    for run in dict.fromkeys(curves["run"]):
        data = curves[curves["run"] == run].sort_values("step")
        variant = data["variant"].iloc[0]
        for panel, (column, _) in enumerate(TRAINING_PANELS):
            if column is not None:
                plot(panel, data, column, variant, marker=".")
        plot(0, data, "reward_max", variant, linestyle=":", marker=".")
        for j, column in enumerate(per_turn):
            plot(1, data, column, variant, marker=".", alpha=0.35 + 0.65 * (j + 1) / len(per_turn))
        plot(1, data, "fast_ratio", variant, linestyle="--", marker=".")
        for column, style in TIME_STYLES.items():
            plot(5, data, column, variant, linestyle=style, marker=".")
    first, last = int(curves["step"].min()), int(curves["step"].max())
    for ax, (_, title), variants_shown in zip(axes, TRAINING_PANELS, shown):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        # steps count from 1: a half-step margin shows every step and never a tick at 0
        ax.set_xlim(first - 0.5, last + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(alpha=0.3)
        if not ax.has_data():
            ax.text(0.5, 0.5, NOT_SHOWN.get(title, "not recorded"), ha="center", va="center", transform=ax.transAxes)
            continue
        floor_at_zero(ax)
        _variant_legend(ax, variants_shown, colors)
    return fig
