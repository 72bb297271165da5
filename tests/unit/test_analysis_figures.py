"""The figures of analysis/plots.py, checked on their matplotlib objects: the variants of a sweep overlaid in one
axes per metric and named in its legend, y axes that never go below 0 for data that never does, and step axes
that start at the first training step, 1."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes

from kevin_exp.analysis import (
    Run,
    Selection,
    StepWindow,
    Variant,
    group_variants,
    load_runs,
    training_curves,
    turn_curves,
)
from kevin_exp.analysis.figures import scaling_figure, training_figure
from tests.unit.test_analysis_metrics import F, hand_config, turn_rows, write_hand_sweep, write_run

HAND_VARIANTS = ["gamma=0.4, normalization=constant", "gamma=1.0, normalization=token"]


def legend_labels(ax: Axes) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def visible_ticks(ax: Axes) -> list[float]:
    low, high = ax.get_xlim()
    return [t for t in ax.get_xticks() if low <= t <= high]


def write_zero_sweep(root: Path) -> list[Run]:
    """Two variants, nothing correct at any step, every logged scalar 0: an axis centred on 0 would go negative."""
    metrics = [{"step": step, "reward_mean": 0.0, "grad_norm": 0.0, "loss": 0.0, "generate_s": 0.0}
               for step in (1, 2, 3)]
    for gamma in (0.4, 1.0):
        rows = [r for step in (1, 2, 3) for r in turn_rows("train", step, "T1", [[F, F], [F, F]])]
        rows += turn_rows("eval", 3, "T1", [[F, F], [F, F]])
        write_run(root / f"gamma={gamma}", {"gamma": gamma, "seed": 0}, rows, metrics)
    return load_runs([str(root)])


def curves_of(runs: list[Run]) -> tuple[list[Variant], pd.DataFrame]:
    variants = group_variants(runs)
    return variants, turn_curves(variants, Selection("eval", StepWindow.parse("last")))


def training_of(variants: list[Variant]) -> pd.DataFrame:
    runs = [run for v in variants for run in v.runs]
    labels = [v.label for v in variants for _ in v.runs]
    return training_curves(runs, [f"{label} ({run.name})" for label, run in zip(labels, runs)], labels)


def test_scaling_figure_overlays_the_variants(tmp_path):
    _, curves = curves_of(load_runs([str(write_hand_sweep(tmp_path / "sweep"))]))
    fig = scaling_figure(curves)
    assert len(fig.axes) == 4  # correctness and speedup (columns) against turns and against kernels (rows)
    for ax in fig.axes:
        assert legend_labels(ax) == HAND_VARIANTS
        assert ax.get_ylim()[0] == 0
    by_turn = fig.axes[0]
    # per variant: best@2 and avg@2 over turns 1, 2; (1.0, token) best@2 correctness 1.0 at both turns
    assert len(by_turn.get_lines()) == 4
    assert list(by_turn.get_lines()[2].get_ydata()) == pytest.approx([1.0, 1.0])
    assert visible_ticks(by_turn) == [1, 2]
    # against kernels: one line per (variant, k) with k in 1, 2; the k legend stays next to the variant legend
    by_kernels = fig.axes[2]
    assert len(by_kernels.get_lines()) == 4 and by_kernels.get_xscale() == "log"
    k_legends = [a for a in by_kernels.artists if a is not by_kernels.get_legend()]
    assert [[t.get_text() for t in legend.get_texts()] for legend in k_legends] == [["k=1", "k=2"]]


def test_all_zero_data_never_gets_a_negative_axis(tmp_path):
    variants, curves = curves_of(write_zero_sweep(tmp_path / "zero"))
    assert (curves["correct_best"] == 0).all() and (curves["speedup_best"] == 0).all()
    for ax in scaling_figure(curves).axes:
        assert ax.get_ylim() == (0, 1)
    fig = training_figure(training_of(variants))
    for ax in fig.axes:
        assert ax.get_ylim()[0] >= 0, ax.get_title()
        assert ax.get_ylim() == (0, 1) or not ax.has_data(), ax.get_title()


def test_training_figure_overlays_variants_from_step_1(tmp_path):
    hand = load_runs([str(write_hand_sweep(tmp_path / "sweep"))])
    # a second training variant beside run A: its loss goes negative, so that axis must not be cut at 0
    rows = [r for step in (1, 2, 3) for r in turn_rows("train", step, "T1", [[(True, 1.0 + step)], [F]])]
    metrics = [{"step": step, "reward_mean": 0.2 * step, "grad_norm": 1.0 / step, "loss": 0.1 - 0.1 * step,
                "generate_s": 1.0} for step in (1, 2, 3)]
    other = write_run(tmp_path / "other", hand_config("C", tmp_path / "other"), rows, metrics)
    runs = [r for r in hand if r.name == "run_A"] + load_runs([str(other)])
    variants = group_variants(runs)
    fig = training_figure(training_of(variants))
    titles = [ax.get_title() for ax in fig.axes]
    assert len(fig.axes) == 6
    for ax in fig.axes:
        assert ax.get_xlabel() == "step"
        assert ax.get_xlim()[0] > 0 and min(visible_ticks(ax)) == 1, ax.get_title()
        assert legend_labels(ax) == HAND_VARIANTS, ax.get_title()
    loss = fig.axes[titles.index("loss")]
    assert loss.get_ylim()[0] < -0.1  # -0.2 at step 3
    for title in ("reward (mean; max dotted)",
                  "correct per turn (lighter: earlier turns); dashed: best turn faster than PyTorch", "not-okay ratio",
                  "grad norm", "time per step (s): generate solid, evaluate dashed, train dotted"):
        assert fig.axes[titles.index(title)].get_ylim()[0] == 0, title
    # both variants' rewards drawn in the reward axes, each in its variant's colour
    reward = fig.axes[titles.index("reward (mean; max dotted)")]
    colors = {tuple(np.round(line.get_color(), 3)) for line in reward.get_lines()}
    assert len(colors) == 2
