"""Training curves per run: metrics.jsonl's scalars, with whatever it lacks (an older run, a killed one)
recomputed from the run's training rows in turns.jsonl where that is possible."""
from __future__ import annotations

import re
from typing import Sequence

import pandas as pd

from kevin_exp.analysis.loading import Run

SCALARS = ("reward_mean", "reward_max", "correct_ratio", "fast_ratio", "not_okay_ratio", "grad_norm", "loss",
           "generate_s", "evaluate_s", "train_s", "step_s")
TURN_COLUMN = re.compile(r"correct_turn_(\d+)")


def turn_columns(columns: Sequence[str]) -> list[str]:
    """``correct_turn_<k>`` columns in turn order."""
    return sorted((c for c in columns if TURN_COLUMN.fullmatch(c)), key=lambda c: int(TURN_COLUMN.fullmatch(c)[1]))


def _from_turn_rows(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty or "split" not in rows:
        return pd.DataFrame()
    train = rows[rows["split"] == "train"]
    if train.empty:
        return pd.DataFrame()
    by_step = train.groupby("step")
    derived = pd.DataFrame({"correct_ratio": by_step["correct"].mean()})
    if "score" in train:
        derived["reward_mean"] = by_step["score"].mean()
        derived["reward_max"] = by_step["score"].max()
    if "not_okay" in train and train["not_okay"].notna().any():  # (None where the model has no usual opening)
        derived["not_okay_ratio"] = train["not_okay"].astype(float).groupby(train["step"]).mean()
    if "speedup" in train and {"task_id", "trajectory"} <= set(train.columns):
        # the share of trajectories whose best turn is correct and faster than the reference (Kevin's fast_1, per trajectory)
        faster = train["correct"].astype(bool) & (pd.to_numeric(train["speedup"], errors="coerce").fillna(0) > 1)
        best = faster.groupby([train["step"], train["task_id"], train["trajectory"]]).any()
        derived["fast_ratio"] = best.groupby(level="step").mean()
    per_turn = train.groupby(["step", "turn"])["correct"].mean().unstack("turn")
    per_turn.columns = [f"correct_turn_{int(t)}" for t in per_turn.columns]
    return derived.join(per_turn).astype(float)


def _from_metrics(metrics: pd.DataFrame) -> pd.DataFrame:
    if metrics.empty or "step" not in metrics:
        return pd.DataFrame()
    metrics = metrics.drop_duplicates("step", keep="last").set_index("step")
    out = metrics[[c for c in (*SCALARS, *turn_columns(metrics.columns)) if c in metrics]].copy()
    if "correct_per_turn" in metrics and not turn_columns(out.columns):
        lists = metrics["correct_per_turn"].dropna()
        for k in range(max((len(v) for v in lists), default=0)):
            out[f"correct_turn_{k + 1}"] = lists.map(lambda v, k=k: v[k] if k < len(v) else None)
    return out.apply(pd.to_numeric, errors="coerce")


def training_curves(runs: Sequence[Run], labels: Sequence[str], variants: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per (run, step): ``run`` (its label), ``variant`` (the label of the variant it belongs to, its
    own label by default), ``run_dir``, ``step``, then the scalars present."""
    frames = []
    for run, label, variant in zip(runs, labels, labels if variants is None else variants):
        logged, derived = _from_metrics(run.metrics), _from_turn_rows(run.rows)
        merged = logged.combine_first(derived) if not logged.empty else derived
        if merged.empty:
            continue
        merged = merged.sort_index().rename_axis("step").reset_index()
        merged.insert(0, "run_dir", str(run.run_dir))
        merged.insert(0, "variant", variant)
        merged.insert(0, "run", label)
        frames.append(merged)
    if not frames:
        return pd.DataFrame(columns=["run", "variant", "run_dir", "step"])
    curves = pd.concat(frames, ignore_index=True)
    ordered = ["run", "variant", "run_dir", "step", *(c for c in SCALARS if c in curves), *turn_columns(curves.columns)]
    return curves[ordered]
