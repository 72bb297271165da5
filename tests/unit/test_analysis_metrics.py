"""Kevin's evaluation metrics (section 5) on small runs whose every number is derived by hand below.

The hand sweep (``write_hand_sweep``) has three runs, evaluated at step 5 on tasks T1 and T2 with 2 trajectories
x 2 turns; a turn is (correct, speedup):

    run A  gamma=0.4 normalization=constant seed=0
      T1  traj0 (F,-) (T,1.5)        traj1 (T,1.5) (T,0.5)     both best at 1.5x: a tie
      T2  traj0 (F,-) (F,-)          traj1 (F,-) (F,-)         nothing correct
    run B  gamma=0.4 normalization=constant seed=1             (pooled with A: same variant, another seed)
      T1  traj0 (T,0.7) (T,1.3)      traj1 (F,-) (F,-)
      T2  traj0 (T,2.0)              traj1 (F,-) (T,0.9)       traj0 lost its second turn
    run C  gamma=1.0 normalization=token seed=0                (differs from A and B in two keys at once)
      T1  traj0 (T,3.0) (F,-)        traj1 (F,-) (F,-)
      T2  traj0 (F,-) (T,1.0)        traj1 (T,-) (F,-)         correct without a timing: 0x

Per trajectory (correct, perf, fast_1, fast_1.5), then per task best@2 / avg@2:
    A  T1 (1,1.5,1,1) (1,1.5,1,1) -> best (1,1.5,1,1)  avg (1,1.5,1,1)
       T2 (0,0,0,0)   (0,0,0,0)   -> best (0,0,0,0)    avg (0,0,0,0)
    B  T1 (1,1.3,1,0) (0,0,0,0)   -> best (1,1.3,1,0)  avg (.5,.65,.5,0)
       T2 (1,2.0,1,1) (1,0.9,0,0) -> best (1,2.0,1,1)  avg (1,1.45,.5,.5)
    C  T1 (1,3.0,1,1) (0,0,0,0)   -> best (1,3.0,1,1)  avg (.5,1.5,.5,.5)
       T2 (1,1.0,1,0) (1,0,0,0)   -> best (1,1.0,1,0)  avg (1,.5,.5,0)     (fast_1 holds at exactly 1.0x)
Variant (0.4, constant) = mean over seeds of the task means:
    seed 0: best (.5,.75,.5,.5)  avg (.5,.75,.5,.5);  seed 1: best (1,1.65,1,.5)  avg (.75,1.05,.5,.25)
    -> best (.75, 1.2, .75, .5)  avg (.625, .9, .5, .375)
Variant (1.0, token): best (1, 2.0, 1, .5)  avg (.75, 1.0, .5, .25)

Intervals: with 2 tasks (and 2 seeds) every single seed x task entry is one possible bootstrap resample, with
probability 1/16 (1/4 with one seed), far above 2.5%, and every resample's mean lies between the smallest and
largest entry; so each 95% interval runs from the smallest to the largest seed x task entry.
"""
from __future__ import annotations

import itertools
import json
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from kevin_exp.analysis import (
    BootstrapSettings,
    BudgetCell,
    Cell,
    NoRunsFound,
    Run,
    Selection,
    StepWindow,
    Table,
    bootstrap,
    budget_splits,
    budget_table,
    expected_max_of_k,
    flatten_config,
    group_variants,
    load_runs,
    parallel_counts,
    pass_at_k,
    render,
    run_dirs_for,
    runs_of_split,
    supported_budgets,
    task_scores,
    trajectory_scores,
    turn_curves,
    variant_table,
    varying_keys,
)
from kevin_exp.analysis.bootstrap import seeds_then_tasks_mean
from kevin_exp.analysis.selection import choose_split, evaluation_rows
from kevin_exp.analysis.training import training_curves
from kevin_exp.errors import UserError

Turn = tuple[bool, float | None]

F: Turn = (False, None)
HAND_EVAL: dict[str, dict[str, list[list[Turn]]]] = {
    "A": {"T1": [[F, (True, 1.5)], [(True, 1.5), (True, 0.5)]], "T2": [[F, F], [F, F]]},
    "B": {"T1": [[(True, 0.7), (True, 1.3)], [F, F]], "T2": [[(True, 2.0)], [F, (True, 0.9)]]},
    "C": {"T1": [[(True, 3.0), F], [F, F]], "T2": [[F, (True, 1.0)], [(True, None), F]]},
}
HAND_CONFIG = {"A": (0.4, "constant", 0), "B": (0.4, "constant", 1), "C": (1.0, "token", 0)}
EVAL_STEP = 5
# run A also trained for two steps on T1 (2 trajectories x 1 turn; steps count from 1): step 1 nothing correct,
# step 2 one 1.0x kernel
HAND_TRAIN = {1: [[F], [F]], 2: [[(True, 1.0)], [F]]}
HAND_NOT_OKAY = {1: [True, False], 2: [False, False]}
HAND_METRICS = [
    {"step": 1, "reward_mean": 0.1, "grad_norm": 0.5, "loss": 0.2, "correct_per_turn": [0.0],
     "generate_s": 1.0, "evaluate_s": 2.0, "train_s": 3.0},
    {"step": 2, "reward_mean": 0.65, "grad_norm": 0.25, "loss": 0.1, "correct_per_turn": [0.5],
     "generate_s": 1.5, "evaluate_s": 2.5, "train_s": 3.5},
]


def turn_rows(split: str, step: int, task: str, trajectories: list[list[Turn]], **extra: Any) -> list[dict[str, Any]]:
    rows = []
    for trajectory, turns in enumerate(trajectories):
        for turn, (correct, speedup) in enumerate(turns, start=1):
            rows.append({"split": split, "step": step, "task_id": task, "level": 1, "trajectory": trajectory,
                         "turn": turn, "status": "correct" if correct else "incorrect", "correct": correct,
                         "speedup": speedup, "score": 0.3 + speedup if correct and speedup else 0.0,
                         "not_okay": False, **extra})
    return rows


def write_run(run_dir: Path, config: dict[str, Any], rows: list[dict[str, Any]],
              metrics: list[dict[str, Any]] | None = None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    common = {"run_id": run_dir.name, "seed": config["seed"], "gamma": config["gamma"]}
    (run_dir / "turns.jsonl").write_text("".join(json.dumps({**common, **r}) + "\n" for r in rows))
    if metrics is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run_dir


def hand_config(name: str, run_dir: Path) -> dict[str, Any]:
    gamma, normalization, seed = HAND_CONFIG[name]
    # launch settings differ between runs on purpose: they must not become variant keys
    return {"gamma": gamma, "normalization": normalization, "seed": seed, "n_turns": 2, "n_trajectories": 2,
            "run_dir": str(run_dir), "resume": "auto", "logger": {"kind": "jsonl", "group": name},
            "resources": {"gpus_per_node": 1 if name == "A" else 8},
            "algorithm": {"gamma": gamma, "normalization": normalization, "aggregation": "sum"},
            "tasks": {"levels": [1, 2]}}


def write_hand_sweep(root: Path) -> Path:
    for name, tasks in HAND_EVAL.items():
        run_dir = root / f"run_{name}"
        rows = [r for task, trajectories in tasks.items() for r in turn_rows("eval", EVAL_STEP, task, trajectories)]
        metrics = None
        if name == "A":
            for step, trajectories in HAND_TRAIN.items():
                train = turn_rows("train", step, "T1", trajectories)
                for row, flag in zip(train, HAND_NOT_OKAY[step]):
                    row["not_okay"] = flag
                rows = train + rows
            metrics = HAND_METRICS
        write_run(run_dir, hand_config(name, run_dir), rows, metrics)
    return root


@pytest.fixture()
def hand_runs(tmp_path: Path):
    return load_runs([str(write_hand_sweep(tmp_path / "sweep"))])


def cells(table: Table, row: int) -> np.ndarray:
    """(value, lo, hi) of each interval cell of a row."""
    return np.array([(c.value, c.lo, c.hi) for c in table.rows[row] if isinstance(c, Cell)])


# ---------------------------------------------------------------- estimators


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 3, 2) == 1.0  # fewer than 2 wrong samples: every pair holds a correct one
    assert pass_at_k(5, 0, 3) == 0.0


@pytest.mark.parametrize("values", [[0.0, 1.2, 1.2, 0.5, 2.0, 0.0], [1.0, 1.0, 1.0], [3.0, 0.0, 0.7, 0.7, 0.7]])
def test_expected_max_matches_all_k_subsets(values):
    n = len(values)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(values, k))
        assert len(subsets) == comb(n, k)
        assert expected_max_of_k(values, k) == pytest.approx(np.mean([max(s) for s in subsets]))


@pytest.mark.parametrize("n, c", [(6, 0), (6, 2), (8, 5), (5, 5)])
def test_pass_at_k_matches_all_k_subsets_and_the_real_valued_estimator(n, c):
    outcomes = [1.0] * c + [0.0] * (n - c)
    for k in range(1, n + 1):
        brute = np.mean([max(s) for s in itertools.combinations(outcomes, k)])
        assert pass_at_k(n, c, k) == pytest.approx(brute)
        assert expected_max_of_k(outcomes, k) == pytest.approx(brute)


def test_expected_max_by_hand_and_bad_k():
    assert expected_max_of_k([1.0, 2.0, 3.0], 2) == pytest.approx(8 / 3)  # pairs: max 2, 3, 3
    assert expected_max_of_k([1.0, 2.0, 3.0], 1) == pytest.approx(2.0)  # k = 1: the mean
    with pytest.raises(ValueError, match="k=4"):
        expected_max_of_k([1.0, 2.0, 3.0], 4)


# ---------------------------------------------------------------- scores


def test_trajectory_scores_by_hand(hand_runs):
    rows = evaluation_rows(hand_runs[:2], "eval", StepWindow.parse("last"))  # runs A (seed 0) and B (seed 1)
    scored = trajectory_scores(rows).set_index(["seed", "task_id", "trajectory"])
    columns = ["correct", "perf", "fast_1", "fast_1.5", "turns"]
    # run B (seed 1), T2: traj0 kept only its first turn (T, 2.0); traj1 became correct at turn 2
    assert scored.loc[("1", "T2", 0), columns].tolist() == [1, 2.0, 1, 1, 1]
    assert scored.loc[("1", "T2", 1), columns].tolist() == [1, 0.9, 0, 0, 2]
    # run A T1: the tie, both trajectories at 1.5x, and fast_1.5 holds at exactly 1.5 (Kevin's >=)
    assert scored.loc[("0", "T1", 0), columns].tolist() == [1, 1.5, 1, 1, 2]
    assert scored.loc[("0", "T1", 1), columns].tolist() == [1, 1.5, 1, 1, 2]
    # over turn 1 only, A T1 traj0 has nothing correct yet
    first = trajectory_scores(rows, max_turns=1).set_index(["seed", "task_id", "trajectory"])
    assert first.loc[("0", "T1", 0), columns].tolist() == [0, 0.0, 0, 0, 1]


def test_task_scores_tie_and_nothing_correct(hand_runs):
    rows = evaluation_rows(hand_runs[:1], "eval", StepWindow.parse("last"))  # run A alone
    per_task = task_scores(trajectory_scores(rows), "perf").set_index("task_id")
    assert per_task.loc["T1", ["best", "avg"]].tolist() == [1.5, 1.5]  # best = max(1.5, 1.5); avg = (1.5 + 1.5) / 2
    assert per_task.loc["T2", ["best", "avg"]].tolist() == [0.0, 0.0]  # no correct kernel: 0x, not left out
    # best of 1 of the 2 trajectories (unbiased estimate) is their mean
    assert task_scores(trajectory_scores(rows), "perf", k=1).set_index("task_id").loc["T1", "best"] == 1.5


# ---------------------------------------------------------------- variants


def test_varying_keys_ignores_launch_settings_and_aliases(hand_runs):
    # run_dir, logger.group and resources.gpus_per_node differ but never change science; algorithm.gamma and
    # algorithm.normalization are the same knobs as gamma and normalization
    assert varying_keys(hand_runs) == ["gamma", "normalization", "seed"]


def test_checkpoint_cadence_and_the_usual_opening_are_not_what_a_run_computed():
    """Two runs made a day apart differ in settings added since (a checkpoint cadence, the response opening the
    records measure against) besides the one the user varied: only that one names their variants."""
    def run(lr: float, **config) -> Run:
        return Run(Path(f"/runs/{lr}"), {"gamma": 0.4, "seed": 0, "trainer.lr": lr, **config}, pd.DataFrame(),
                   pd.DataFrame())

    runs = [run(5e-6, **{"model.usual_opening": "Okay", "trainer.state_every": None}),
            run(0.0, **{"model.usual_opening": None, "trainer.state_every": 1, "trainer.keep_every": 4})]
    assert varying_keys(runs) == ["trainer.lr"]


def test_a_models_shape_keys_fold_into_its_name():
    """Runs of two models differ in every shape key of the model group too; the table shows the model's name
    only. A key of the group that the name does not decide (a learning rate swept beside it) stays."""
    def run(name: str, hidden: int, layers: int, gamma: float, lr: float) -> Run:
        config = {"gamma": gamma, "seed": 0, "model.name": name, "model.hidden_size": hidden,
                  "model.num_layers": layers, "model.lr_hint": lr}
        return Run(Path(f"/runs/{name}-{gamma}-{lr}"), config, pd.DataFrame(), pd.DataFrame())

    runs = [run("qwen7b", 3584, 28, 0.4, 1e-6), run("qwen14b", 5120, 48, 0.4, 1e-6), run("qwen7b", 3584, 28, 1.0, 2e-6)]
    assert varying_keys(runs) == ["gamma", "model.name", "model.lr_hint"]


def test_two_keys_at_once_give_one_row_per_combination_and_seeds_pool(hand_runs):
    variants = group_variants(hand_runs)
    assert [v.values for v in variants] == [{"gamma": 0.4, "normalization": "constant"},
                                           {"gamma": 1.0, "normalization": "token"}]
    assert [v.seeds for v in variants] == [[0, 1], [0]]
    assert variants[0].label == "gamma=0.4, normalization=constant"


def test_flatten_config():
    flat = flatten_config({"gamma": 0.4, "model": {"name": "tiny", "dims": {"h": 8}}, "levels": [1, 2], "x": {}})
    assert flat == {"gamma": 0.4, "model.name": "tiny", "model.dims.h": 8, "levels": "[1, 2]", "x": "{}"}


# ---------------------------------------------------------------- the variant table


def test_variant_table_by_hand(hand_runs):
    selection = Selection("eval", StepWindow.parse("last"))
    table = variant_table(group_variants(hand_runs), selection)
    assert table.columns[:3] == ["gamma", "normalization", "k x n"]
    assert table.columns[-2:] == ["tasks", "seeds"]
    # (value, lo, hi) for correct, speedup, fast_1, fast_1.5, each best@k then avg@k (derivation: module doc)
    assert cells(table, 0) == pytest.approx(np.array([
        (0.75, 0, 1), (0.625, 0, 1), (1.2, 0, 2.0), (0.9, 0, 1.5),
        (0.75, 0, 1), (0.5, 0, 1), (0.5, 0, 1), (0.375, 0, 1)]))
    assert cells(table, 1) == pytest.approx(np.array([
        (1, 1, 1), (0.75, 0.5, 1), (2.0, 1.0, 3.0), (1.0, 0.5, 1.5),
        (1, 1, 1), (0.5, 0.5, 0.5), (0.5, 0, 1), (0.25, 0, 0.5)]))
    assert table.rows[0][:3] == [0.4, "constant", "2x2"] and table.rows[0][-2:] == [2, 2]
    assert table.rows[1][:3] == [1.0, "token", "2x2"] and table.rows[1][-2:] == [2, 1]
    again = variant_table(group_variants(hand_runs), selection)
    assert render(again) == render(table)  # the bootstrap RNG is seeded: same rows, same intervals


def test_variant_table_markdown_row(hand_runs):
    table = variant_table(group_variants(hand_runs), Selection("eval", StepWindow.parse("last")))
    lines = render(table, "markdown").splitlines()
    assert lines[2].startswith("| gamma | normalization | k x n | correct best@k | correct avg@k | speedup best@k |")
    assert lines[3].startswith("| :--- | :--- | :--- | ---: |")
    assert lines[4] == ("| 0.4 | constant | 2x2 | 75.0% [0.0, 100.0] | 62.5% [0.0, 100.0] | 1.20x [0.00, 2.00] | "
                        "0.90x [0.00, 1.50] | 75.0% [0.0, 100.0] | 50.0% [0.0, 100.0] | 50.0% [0.0, 100.0] | "
                        "37.5% [0.0, 100.0] | 2 | 2 |")
    assert lines[5] == ("| 1.0 | token | 2x2 | 100.0% [100.0, 100.0] | 75.0% [50.0, 100.0] | 2.00x [1.00, 3.00] | "
                        "1.00x [0.50, 1.50] | 100.0% [100.0, 100.0] | 50.0% [50.0, 50.0] | 50.0% [0.0, 100.0] | "
                        "25.0% [0.0, 50.0] | 2 | 1 |")


def test_first_n_turns(hand_runs):
    table = variant_table(group_variants(hand_runs), Selection("eval", StepWindow.parse("last"), max_turns=1))
    # turn 1 only. A: T1 (0,0) (1,1.5) -> best (1,1.5) avg (.5,.75); T2 zeros. B: T1 (1,.7) (0,0) -> best (1,.7)
    # avg (.5,.35); T2 (1,2.0) (0,0) -> best (1,2.0) avg (.5,1.0). seed 0: best (.5,.75) avg (.25,.375);
    # seed 1: best (1,1.35) avg (.5,.675) -> best (.75, 1.05), avg (.375, .525)
    assert cells(table, 0)[:4, 0] == pytest.approx([0.75, 0.375, 1.05, 0.525])
    assert table.rows[0][2] == "2x1"


def test_training_split_and_step_windows(hand_runs):
    split, notes = choose_split(hand_runs, None)
    assert split == "eval" and notes == []
    split, notes = choose_split(hand_runs, "train")
    assert notes == ["no train rows in run_B, run_C: left out"]
    train_runs = [r for r in hand_runs if r.name == "run_A"]
    variants = group_variants(train_runs)
    assert [v.values for v in variants] == [{}]

    def values(steps: str) -> list[float]:
        return cells(variant_table(variants, Selection("train", StepWindow.parse(steps))), 0)[:, 0].tolist()

    # last step (2): T1 traj0 (T,1.0), traj1 F -> best (1, 1.0, 1, 0), avg (.5, .5, .5, 0)
    assert values("last") == pytest.approx([1, 0.5, 1.0, 0.5, 1, 0.5, 0, 0])
    # steps 1 and 2: T1's two blocks averaged; step 1 scores 0 everywhere
    assert values("all") == pytest.approx([0.5, 0.25, 0.5, 0.25, 0.5, 0.25, 0, 0])
    assert values("1:1") == pytest.approx([0] * 8)
    assert values(":2") == values("all") and values("2:") == values("last") and values("0:2") == values("all")


def test_step_window_parsing():
    assert StepWindow.parse("3:7") == StepWindow("range", 3, 7)
    assert str(StepWindow.parse("3:")) == "3:"
    steps = pd.Series([1, 3, 5, 7, 9])
    assert StepWindow.parse("3:7").mask(steps).tolist() == [False, True, True, True, False]
    assert StepWindow.parse("last").mask(steps).tolist() == [False, False, False, False, True]
    assert StepWindow.parse(":1").mask(steps).tolist() == [True, False, False, False, False]
    for bad in ("first", "7:3", "a:b", "-1:3"):
        with pytest.raises(UserError, match="--steps"):
            StepWindow.parse(bad)


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_by_hand():
    # one seed, tasks scoring 0 and 1: resample means are 0, .5, 1 with probability 1/4, 1/2, 1/4
    estimate = bootstrap(np.array([[0.0, 1.0]]))
    assert (estimate.value, estimate.lo, estimate.hi) == (0.5, 0.0, 1.0)
    constant = bootstrap(np.array([[0.7, 0.7, 0.7], [0.7, 0.7, 0.7]]))
    assert (constant.lo, constant.hi) == pytest.approx((0.7, 0.7))
    # 3 tasks, 1 seed: 27 equally likely resamples; their mean of means is the point estimate
    wide = bootstrap(np.array([[0.0, 0.3, 0.9]]), BootstrapSettings(n_resamples=4000))
    assert wide.lo == pytest.approx(0.0) and wide.hi == pytest.approx(0.9) and wide.value == pytest.approx(0.4)
    assert bootstrap(np.array([[0.0, 0.3, 0.9]]), BootstrapSettings(n_resamples=500, rng_seed=3)) == \
        bootstrap(np.array([[0.0, 0.3, 0.9]]), BootstrapSettings(n_resamples=500, rng_seed=3))


def test_seeds_that_saw_different_tasks():
    # seed 0 saw only task a (1.0); seed 1 saw a (0.0) and b (1.0): seed means 1.0 and .5
    assert seeds_then_tasks_mean(np.array([[1.0, np.nan], [0.0, 1.0]])) == pytest.approx(0.75)


# ---------------------------------------------------------------- fixed budget


def test_budget_splits():
    assert [s.label for s in budget_splits(128, 8)] == ["16x8", "32x4", "64x2", "128x1"]
    assert [s.label for s in budget_splits(12, 8)] == ["2x6", "3x4", "4x3", "6x2", "12x1"]
    with pytest.raises(UserError, match="--budget 0: expected a positive number"):
        budget_splits(0, 4)


def test_budget_table_by_hand(hand_runs):
    variants = group_variants(hand_runs)
    selection = Selection("eval", StepWindow.parse("last"))
    table = budget_table(variants, selection, 4)
    # 4 = 2x2 (all data: best@2 speedup / correctness as in the variant table) or 4x1 (needs 4 trajectories)
    assert table.columns == ["gamma", "normalization", "2x2"]
    assert table.rows == [[0.4, "constant", BudgetCell(pytest.approx(1.2), pytest.approx(0.75))],
                          [1.0, "token", BudgetCell(pytest.approx(2.0), pytest.approx(1.0))]]
    assert table.notes == ["4x1 skipped: needs 4 trajectories per task, the data has 2"]
    table = budget_table(variants, selection, 2)
    # 1x2: best of 1 of 2 trajectories = avg@2 over both turns: (.9x, 62.5%) and (1.0x, 75%)
    # 2x1: turn 1 only, best@2: A T1 1.5x, T2 0; B T1 .7x, T2 2.0x -> (.75 + 1.35) / 2 = 1.05x, correct .75;
    #      C T1 3.0x, T2 0x (correct, untimed) -> 1.5x, correct 1.0
    assert table.columns == ["gamma", "normalization", "1x2", "2x1"]
    assert [[(c.speedup, c.correct) for c in row[2:]] for row in table.rows] == [
        [pytest.approx((0.9, 0.625)), pytest.approx((1.05, 0.75))],
        [pytest.approx((1.0, 0.75)), pytest.approx((1.5, 1.0))]]
    assert table.notes == []
    assert "| 0.4 | constant | 0.90x / 62.5% | 1.05x / 75.0% |" in render(table, "markdown")


def test_budget_uses_the_unbiased_estimator(tmp_path):
    # one task, 4 trajectories x 1 turn: 0x (incorrect), 1.0x, 1.0x (a tie), 2.0x; budget 2 = 2x1 needs k=2 of 4:
    # E[max of 2] over the 6 pairs = (1 + 1 + 2 + 1 + 2 + 2) / 6 = 1.5; correct: 1 - C(1,2)/C(4,2) = 1
    trajectories = [[F], [(True, 1.0)], [(True, 1.0)], [(True, 2.0)]]
    run = write_run(tmp_path / "r", {"gamma": 0.4, "seed": 0}, turn_rows("eval", 1, "T", trajectories))
    variants = group_variants(load_runs([str(run)]))
    selection = Selection("eval", StepWindow.parse("last"))
    table = budget_table(variants, selection, 2)
    assert table.columns == ["2x1"] and table.rows == [[BudgetCell(pytest.approx(1.5), 1.0)]]
    assert budget_table(variants, selection, 8).notes == [
        "--budget 8 is more than r holds: 4 trajectories x 1 turn = 4 kernels per task; budgets it supports "
        "(k <= 4, n <= 1): 1, 2, 3, 4"]


def test_budget_notes_name_the_runs_that_cannot_fill_it(tmp_path, hand_runs):
    selection = Selection("eval", StepWindow.parse("last"))
    # every hand run holds 2 trajectories x 2 turns = 4 kernels per task: no cell, one note naming them all
    table = budget_table(group_variants(hand_runs), selection, 16)
    assert table.rows == [] and table.columns == ["gamma", "normalization"]
    assert table.notes == ["--budget 16 is more than all 3 runs hold: 2 trajectories x 2 turns = 4 kernels "
                           "per task; budgets they support (k <= 2, n <= 2): 1, 2, 4"]
    assert budget_table(group_variants(hand_runs), selection, 3).notes == [
        "--budget 3 does not split into k trajectories x n turns that all 3 runs hold (2 trajectories x 2 "
        "turns per task); budgets they support (k <= 2, n <= 2): 1, 2, 4"]
    # a wide run (4 trajectories x 2 turns) fills 8 = 4x2, a narrow one (2 x 2) nothing: a row each, one note
    wide = [r for task in ("T1", "T2") for r in turn_rows("eval", 3, task, [[F, (True, 2.0)], [F, F], [F, F], [F, F]])]
    narrow = [r for task in ("T1", "T2") for r in turn_rows("eval", 3, task, [[F, F], [F, F]])]
    runs = load_runs([str(write_run(tmp_path / "wide", {"gamma": 0.4, "seed": 0}, wide)),
                      str(write_run(tmp_path / "narrow", {"gamma": 1.0, "seed": 0}, narrow))])
    table = budget_table(group_variants(runs), selection, 8)
    assert table.columns == ["gamma", "4x2"]
    assert table.rows == [[0.4, BudgetCell(2.0, 1.0)], [1.0, None]]
    assert table.notes == [
        "--budget 8 is more than narrow holds: 2 trajectories x 2 turns = 4 kernels per task; budgets it supports "
        "(k <= 2, n <= 2): 1, 2, 4",
        "8x1 skipped for gamma=0.4: needs 8 trajectories per task, the data has 4"]


def test_supported_budgets():
    assert supported_budgets(2, 2) == [1, 2, 4]
    assert supported_budgets(4, 2) == [1, 2, 3, 4, 6, 8]
    assert supported_budgets(16, 8)[-4:] == [105, 112, 120, 128]


# ---------------------------------------------------------------- per-turn curves


def test_parallel_counts():
    assert parallel_counts(16) == [1, 2, 4, 8, 16]
    assert parallel_counts(6) == [1, 2, 4, 6]
    assert parallel_counts(1) == [1]


def test_turn_curves_by_hand(hand_runs):
    curves = turn_curves(group_variants(hand_runs), Selection("eval", StepWindow.parse("last")))
    got = curves[["gamma", "k", "turn", "kernels", "correct_best", "correct_avg", "speedup_best", "speedup_avg"]]
    # k=1 best = avg; turn 1 values as in test_first_n_turns; turn 2 = the variant table. C turn 1: T1 (1,3.0)
    # (0,0) -> best (1,3) avg (.5,1.5); T2 (0,0) (1,0) -> best (1,0) avg (.5,0): best (1, 1.5), avg (.5, .75)
    expected = [
        [0.4, 1, 1, 1, 0.375, 0.375, 0.525, 0.525],
        [0.4, 2, 1, 2, 0.75, 0.375, 1.05, 0.525],
        [0.4, 1, 2, 2, 0.625, 0.625, 0.9, 0.9],
        [0.4, 2, 2, 4, 0.75, 0.625, 1.2, 0.9],
        [1.0, 1, 1, 1, 0.5, 0.5, 0.75, 0.75],
        [1.0, 2, 1, 2, 1.0, 0.5, 1.5, 0.75],
        [1.0, 1, 2, 2, 0.75, 0.75, 1.0, 1.0],
        [1.0, 2, 2, 4, 1.0, 0.75, 2.0, 1.0],
    ]
    assert got.to_numpy(dtype=float) == pytest.approx(np.array(expected))
    assert (curves["correct_best_lo"] <= curves["correct_best"]).all()
    assert (curves["speedup_best_hi"] >= curves["speedup_best"]).all()


# ---------------------------------------------------------------- training curves


def test_training_curves_complete_metrics_from_turn_rows(hand_runs):
    run = next(r for r in hand_runs if r.name == "run_A")
    curves = training_curves([run], ["A"]).set_index("step")
    assert curves["reward_mean"].tolist() == [0.1, 0.65]  # logged
    assert curves["correct_turn_1"].tolist() == [0.0, 0.5]  # logged as correct_per_turn
    assert curves.index.tolist() == [1, 2]
    assert curves["not_okay_ratio"].tolist() == [0.5, 0.0]  # not logged: step 1 flags (T, F), step 2 (F, F)
    assert curves["reward_max"].tolist() == pytest.approx([0.0, 1.3])  # not logged: 0.3 + 1.0x at step 2
    assert curves["grad_norm"].tolist() == [0.5, 0.25]
    assert curves["fast_ratio"].tolist() == [0.0, 0.0]  # the one correct kernel is 1.0x: not faster


def test_the_fast_share_counts_trajectories_whose_best_turn_is_correct_and_faster(tmp_path):
    rows = [*turn_rows("train", 1, "T1", [[F, (True, 1.5)], [(True, 0.5), (True, 0.9)]]),
            *turn_rows("train", 1, "T2", [[(True, 2.0), F], [F, F]]),
            *turn_rows("train", 2, "T1", [[(True, 1.2), (True, 1.1)], [F, (True, 3.0)]])]
    run_dir = write_run(tmp_path / "sweep" / "run_A", hand_config("A", tmp_path / "sweep" / "run_A"), rows)
    [run] = load_runs([str(run_dir)])
    curves = training_curves([run], ["A"]).set_index("step")
    assert curves["fast_ratio"].tolist() == [0.5, 1.0]  # step 1: 2 of 4 trajectories; step 2: both


# ---------------------------------------------------------------- evaluations of checkpoints

# Three evaluations (each its own run directory, as kevin_exp.evaluate writes them) of checkpoints trained with
# 2 trajectories x 3 turns, evaluated with 4 x 2 at training step 30; each row carries the checkpoint's training
# settings and the evaluation's own budget in eval_n_trajectories x eval_n_turns. The evaluation jobs' configs
# all hold the same unrelated defaults (gamma 0.4, 16 x 8, seed 0).
EVAL_CHECKPOINTS = {"eval_a": (0.4, 0), "eval_b": (0.4, 1), "eval_c": (1.0, 0)}  # training gamma, training seed


def eval_config(name: str, run_dir: Path) -> dict[str, Any]:
    return {"gamma": 0.4, "normalization": "constant", "seed": 0, "n_trajectories": 16, "n_turns": 8,
            "checkpoint": f"/runs/{name}/checkpoints/step_000030", "run_dir": str(run_dir),
            "eval": {"n_trajectories": 4, "n_turns": 2, "tasks_per_batch": 2},
            "algorithm": {"gamma": 0.4, "normalization": "constant", "aggregation": "sum"}}


def write_eval_sweep(root: Path) -> Path:
    for name, (gamma, seed) in EVAL_CHECKPOINTS.items():
        # gamma 0.4: trajectory 0 of each task reaches 2.0x at turn 2; gamma 1.0: nothing correct
        first = [F, (True, 2.0)] if gamma == 0.4 else [F, F]
        trained = {"gamma": gamma, "seed": seed, "n_trajectories": 2, "n_turns": 3, "normalization": "constant",
                   "tasks_per_step": 2, "aggregation": "sum", "estimator": "grpo", "model": "tiny",
                   "eval_n_trajectories": 4, "eval_n_turns": 2}
        trajectories = [first, [F, F], [F, F], [F, F]]
        rows = [r for task in ("T1", "T2") for r in turn_rows("eval", 30, task, trajectories, **trained)]
        run_dir = root / name
        write_run(run_dir, eval_config(name, run_dir), rows)
    return root


def test_evaluations_group_by_the_checkpoints_training_settings(tmp_path):
    runs = runs_of_split(load_runs([str(write_eval_sweep(tmp_path / "evals"))]), "eval")
    # the checkpoint's gamma and seed, not the evaluation job's; the checkpoint paths add nothing to them
    assert [(r.config["gamma"], r.config["seed"], r.config["n_trajectories"]) for r in runs] == \
        [(0.4, 0, 2), (0.4, 1, 2), (1.0, 0, 2)]
    assert varying_keys(runs) == ["gamma", "seed"]
    variants = group_variants(runs)
    assert [v.values for v in variants] == [{"gamma": 0.4}, {"gamma": 1.0}]
    selection = Selection("eval", StepWindow.parse("last"))
    table = variant_table(variants, selection)
    # k = 4 trajectories per task as evaluated (not the 2 of training), over the 2 evaluated turns
    assert table.columns[:2] == ["gamma", "k x n"] and "4x2" in table.title
    assert [row[:2] + row[-2:] for row in table.rows] == [[0.4, "4x2", 2, 2], [1.0, "4x2", 2, 1]]
    # gamma 0.4: per task best@4 (correct 1, 2.0x), avg@4 (.25, .5x); gamma 1.0: zeros
    assert cells(table, 0)[:4, 0] == pytest.approx([1.0, 0.25, 2.0, 0.5])
    assert cells(table, 1)[:, 0] == pytest.approx([0.0] * 8)
    assert sorted(turn_curves(variants, selection)["k"].unique()) == [1, 2, 4]
    assert budget_table(variants, selection, 8).columns == ["gamma", "4x2"]


def test_two_checkpoints_of_one_training_run_stay_apart(tmp_path):
    rows = [r for r in turn_rows("eval", 10, "T1", [[F], [F]], gamma=1.0, seed=3)]
    runs = [write_run(tmp_path / name, {**eval_config(name, tmp_path / name), "checkpoint": f"/runs/r/{name}"}, rows)
            for name in ("step_000010", "step_000020")]
    loaded = runs_of_split(load_runs([str(r) for r in runs]), "eval")
    # same training settings and seed: only the checkpoint tells them apart
    assert varying_keys(loaded) == ["checkpoint"]
    assert len(group_variants(loaded)) == 2


# ---------------------------------------------------------------- rendering


def small_table() -> Table:
    return Table(title="T", columns=["gamma", "correct", "16x8"], key_columns=1, notes=["n_1"],
                 rows=[[0.4, Cell(0.82, 0.761, 0.873), BudgetCell(1.1, 0.82)],
                       [1.0, Cell(1.105, 0.9, 1.3, kind="speedup"), None]])


def test_render_markdown():
    assert render(small_table(), "markdown") == (
        "### T\n\n| gamma | correct | 16x8 |\n| :--- | ---: | ---: |\n"
        "| 0.4 | 82.0% [76.1, 87.3] | 1.10x / 82.0% |\n| 1.0 | 1.10x [0.90, 1.30] | - |\n\nNote: n_1\n")


def test_render_csv():
    assert render(small_table(), "csv") == (
        "# T\ngamma,correct,correct lo,correct hi,16x8 speedup,16x8 correct\n"
        "0.4,0.82,0.761,0.873,1.1,0.82\n1.0,1.105,0.9,1.3,,\n# note: n_1\n")


def test_render_latex():
    assert render(small_table(), "latex") == (
        "% T\n\\begin{tabular}{lrr}\n\\toprule\ngamma & correct & 16x8 \\\\\n\\midrule\n"
        "0.4 & 82.0\\% [76.1, 87.3] & 1.10x / 82.0\\% \\\\\n1.0 & 1.10x [0.90, 1.30] & - \\\\\n"
        "\\bottomrule\n\\end{tabular}\n% note: n_1\n")
    with pytest.raises(UserError, match="--format"):
        render(small_table(), "html")


# ---------------------------------------------------------------- finding runs


def test_finding_runs(tmp_path):
    sweep = write_hand_sweep(tmp_path / "sweep")
    assert [p.name for p in run_dirs_for(str(sweep))] == ["run_A", "run_B", "run_C"]
    assert run_dirs_for(str(sweep / "run_B")) == [sweep / "run_B"]
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps({"sweep_name": "other", "sweep_dir": "/nowhere"}) + "\n"
                      + json.dumps({"sweep_name": "hand", "sweep_dir": str(sweep)}) + "\n")
    assert [p.name for p in run_dirs_for("hand", ledger)] == ["run_A", "run_B", "run_C"]
    with pytest.raises(NoRunsFound, match="^nope: .*no sweep of that name in the ledger"):
        run_dirs_for("nope", ledger)
    with pytest.raises(NoRunsFound, match="^other: the ledger .* /nowhere, which holds no run"):
        run_dirs_for("other", ledger)
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoRunsFound, match="empty: a directory with no turns.jsonl"):
        run_dirs_for(str(tmp_path / "empty"), ledger)
    # the same run named twice (directly and through its sweep) is loaded once
    assert len(load_runs([str(sweep / "run_A"), str(sweep)], ledger)) == 3
