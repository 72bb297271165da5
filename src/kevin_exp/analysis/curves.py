"""Test-time scaling curves (Kevin Figs. 5-6): correctness and mean speedup, best@k and avg@k, after each
refinement turn, one curve per number k of parallel trajectories (unbiased best-of-k for k below the number
sampled); ``kernels`` = k x turn gives the compute-matched view."""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from kevin_exp.analysis.bootstrap import BootstrapSettings, bootstrap
from kevin_exp.analysis.scores import seed_task_matrix, task_scores, trajectories_per_task, trajectory_scores
from kevin_exp.analysis.tables import STATS, Cell, Metric, Selection, Table
from kevin_exp.analysis.variants import Variant

CURVE_METRICS = (Metric("correct", "correct", "percent"), Metric("speedup", "perf", "speedup"))


def parallel_counts(available: int) -> list[int]:
    """Powers of two up to ``available``, and ``available`` itself."""
    counts = [1 << i for i in range(available.bit_length()) if 1 << i <= available]
    return counts if counts[-1] == available else [*counts, available]


def turn_curves(variants: Sequence[Variant], selection: Selection,
                settings: BootstrapSettings = BootstrapSettings()) -> pd.DataFrame:
    """One row per (variant, k, turn): ``<metric>_<best|avg>`` with ``_lo``/``_hi`` bootstrap bounds."""
    records: list[dict[str, Any]] = []
    for variant in variants:
        rows = selection.rows(variant)
        if rows.empty:
            continue
        available = int(trajectories_per_task(trajectory_scores(rows)).max())
        for turn in range(1, int(rows["turn"].max()) + 1):
            scored = trajectory_scores(rows, turn)
            for k in parallel_counts(available):
                record: dict[str, Any] = {"variant": variant.label, **variant.values, "k": k, "turn": turn,
                                          "kernels": k * turn}
                for metric in CURVE_METRICS:
                    per_task = task_scores(scored, metric.column, k)
                    for stat in STATS:
                        estimate = bootstrap(seed_task_matrix(per_task, stat), settings)
                        name = f"{metric.name}_{stat}"
                        record.update({name: estimate.value, f"{name}_lo": estimate.lo, f"{name}_hi": estimate.hi})
                records.append(record)
    return pd.DataFrame(records)


def curve_table(curves: pd.DataFrame, keys: Sequence[str], selection: Selection) -> Table:
    columns = [f"{m.name} {stat}@k" for m in CURVE_METRICS for stat in STATS]
    table = Table(title=f"Per turn ({selection.split} split, steps {selection.window}): k parallel trajectories, "
                        "scored over turns 1..turn; kernels = k x turn (the compute-matched axis)",
                  columns=[*keys, "k", "turn", "kernels", *columns], rows=[], key_columns=len(keys) + 3)
    for record in curves.to_dict("records"):
        cells = [Cell(record[f"{m.name}_{stat}"], record[f"{m.name}_{stat}_lo"], record[f"{m.name}_{stat}_hi"], m.kind)
                 for m in CURVE_METRICS for stat in STATS]
        table.rows.append([*(record[k] for k in keys), record["k"], record["turn"], record["kernels"], *cells])
    return table
