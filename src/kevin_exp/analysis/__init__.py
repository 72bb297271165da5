"""Kevin-style evaluation of runs and sweeps (paper section 5): variant tables with bootstrap intervals, the
fixed-budget view, test-time scaling curves and training curves. Pure functions of the runs' records; the
scripts in analysis/ print and plot them."""
from kevin_exp.analysis.bootstrap import BootstrapSettings, Estimate, bootstrap
from kevin_exp.analysis.budget import BudgetSplit, budget_splits, budget_table, supported_budgets
from kevin_exp.analysis.curves import curve_table, parallel_counts, turn_curves
from kevin_exp.analysis.estimators import expected_max_of_k, pass_at_k
from kevin_exp.analysis.loading import NoRunsFound, Run, flatten_config, load_run, load_runs, run_dirs_for
from kevin_exp.analysis.render import render
from kevin_exp.analysis.scores import task_scores, trajectory_scores
from kevin_exp.analysis.selection import StepWindow, choose_split, evaluation_rows, runs_of_split
from kevin_exp.analysis.tables import BudgetCell, Cell, Selection, Table, variant_table
from kevin_exp.analysis.training import training_curves
from kevin_exp.analysis.variants import Variant, group_variants, varying_keys

__all__ = [
    "BootstrapSettings", "BudgetCell", "BudgetSplit", "Cell", "Estimate", "NoRunsFound", "Run", "Selection",
    "StepWindow", "Table", "Variant", "bootstrap", "budget_splits", "budget_table", "choose_split", "curve_table",
    "evaluation_rows", "expected_max_of_k", "flatten_config", "group_variants", "load_run", "load_runs",
    "parallel_counts", "pass_at_k", "render", "run_dirs_for", "runs_of_split", "supported_budgets", "task_scores",
    "training_curves", "trajectory_scores", "turn_curves", "variant_table", "varying_keys",
]
