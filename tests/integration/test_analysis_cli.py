"""analysis/ablation_table.py and analysis/plots.py run as real subprocesses on the hand sweep of
tests/unit/test_analysis_metrics.py, whose module docstring derives every number asserted here."""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.unit.test_analysis_metrics import (
    HAND_METRICS,
    HAND_TRAIN,
    hand_config,
    turn_rows,
    write_eval_sweep,
    write_hand_sweep,
    write_run,
)

REPO = Path(__file__).resolve().parents[2]

# the variant table's rows in Markdown: (gamma, normalization) = (0.4, constant) pools seeds 0 and 1
ROW_04 = ("| 0.4 | constant | 2x2 | 75.0% [0.0, 100.0] | 62.5% [0.0, 100.0] | 1.20x [0.00, 2.00] | 0.90x [0.00, 1.50] "
          "| 75.0% [0.0, 100.0] | 50.0% [0.0, 100.0] | 50.0% [0.0, 100.0] | 37.5% [0.0, 100.0] | 2 | 2 |")
ROW_10 = ("| 1.0 | token | 2x2 | 100.0% [100.0, 100.0] | 75.0% [50.0, 100.0] | 2.00x [1.00, 3.00] | 1.00x [0.50, 1.50] "
          "| 100.0% [100.0, 100.0] | 50.0% [50.0, 50.0] | 50.0% [0.0, 100.0] | 25.0% [0.0, 50.0] | 2 | 1 |")


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, f"analysis/{script}", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    return write_hand_sweep(tmp_path / "sweep")


@pytest.fixture()
def ledger(tmp_path: Path, sweep: Path) -> Path:
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps({"sweep_name": "hand", "sweep_dir": str(sweep), "command": "python -m kevin_exp.train -m"})
                    + "\n")
    return path


def csv_sections(text: str) -> dict[str, pd.DataFrame]:
    """The CSV output's tables, keyed by the first word of each '# title' line."""
    sections: dict[str, pd.DataFrame] = {}
    for block in text.strip().split("\n\n"):
        title, body = block.split("\n", 1)
        sections[title.removeprefix("# ").split()[0]] = pd.read_csv(io.StringIO(body), comment="#")
    return sections


def test_markdown_tables_for_a_sweep_dir(sweep):
    result = run_script("ablation_table.py", str(sweep), "--budget", "4")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert ROW_04 in lines and ROW_10 in lines
    # fixed budget 4 = 2x2 only: best@2 speedup / correctness; 4x1 would need 4 trajectories per task
    assert "| 0.4 | constant | 1.20x / 75.0% |" in lines and "| 1.0 | token | 2.00x / 100.0% |" in lines
    assert "Note: 4x1 skipped: needs 4 trajectories per task, the data has 2" in lines
    # per turn: k=2 at turn 2 is the whole table's best@2; k=1 at turn 1 for (1.0, token): T1 (.5, 1.5x),
    # T2 (.5, 0x) -> 50%, .75x, with best@1 = avg@1
    assert ("| 0.4 | constant | 2 | 2 | 4 | 75.0% [0.0, 100.0] | 62.5% [0.0, 100.0] | 1.20x [0.00, 2.00] | "
            "0.90x [0.00, 1.50] |") in lines
    assert any(line.startswith("| 1.0 | token | 1 | 1 | 1 | 50.0% [") and "| 0.75x [" in line for line in lines)
    turn_rows = [line for line in lines if line.startswith(("| 0.4 | constant | 1 |", "| 0.4 | constant | 2 |",
                                                            "| 1.0 | token | 1 |", "| 1.0 | token | 2 |"))]
    assert len(turn_rows) == 8  # 2 variants x k in {1, 2} x turns {1, 2}


def test_csv_for_a_sweep_name_from_the_ledger(tmp_path, ledger):
    out = tmp_path / "tables" / "hand.csv"
    result = run_script("ablation_table.py", "hand", "--ledger", str(ledger), "--format", "csv", "--budget", "2",
                        "--out", str(out))
    assert result.returncode == 0, result.stderr
    sections = csv_sections(out.read_text())
    variants = sections["Variants:"]
    assert variants[["gamma", "normalization", "seeds", "tasks"]].values.tolist() == [[0.4, "constant", 2, 2],
                                                                                     [1.0, "token", 1, 2]]
    assert variants["correct best@k"].tolist() == [0.75, 1.0]
    assert variants["speedup avg@k"].tolist() == [0.9, 1.0]
    assert variants["fast_1.5 avg@k hi"].tolist() == [1.0, 0.5]
    budget = sections["Fixed"]
    # 1x2 = avg@2 over both turns; 2x1 = best@2 over turn 1 (derivations in the unit test)
    assert budget[["1x2 speedup", "1x2 correct", "2x1 speedup", "2x1 correct"]].values.tolist() == [
        [0.9, 0.625, 1.05, 0.75], [1.0, 0.75, 1.5, 1.0]]
    assert len(sections["Per"]) == 8


def test_latex_and_training_split(sweep):
    result = run_script("ablation_table.py", str(sweep), "--format", "latex", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert "\\begin{tabular}{lllrrrrrrrrrr}" in result.stdout
    assert ("0.4 & constant & 2x2 & 75.0\\% [0.0, 100.0] & 62.5\\% [0.0, 100.0] & 1.20x [0.00, 2.00] & "
            "0.90x [0.00, 1.50] & ") in result.stdout
    assert "Per turn" not in result.stdout

    # only run A has training rows; its last step (2): T1 traj0 1.0x, traj1 nothing correct
    result = run_script("ablation_table.py", str(sweep), "--split", "train", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert "note: no train rows in run_B, run_C: left out" in result.stderr
    assert ("| 2x1 | 100.0% [100.0, 100.0] | 50.0% [50.0, 50.0] | 1.00x [1.00, 1.00] | 0.50x [0.50, 0.50] | "
            "100.0% [100.0, 100.0] | 50.0% [50.0, 50.0] | 0.0% [0.0, 0.0] | 0.0% [0.0, 0.0] | 1 | 1 |") in result.stdout


def test_a_half_written_run_is_named_and_its_unfinished_step_left_out(sweep):
    """Run D trained as run A did (same variant, seed 2) but stopped inside step 2: its turn rows of step 2 are
    there, its metrics row is not, and the kill cut turns.jsonl's last line. Its step 2 must not stand beside
    run A's finished step 2, and the table must say which step of each run it used."""
    train = [r for step, t in HAND_TRAIN.items() for r in turn_rows("train", step, "T1", t)]
    (sweep / "run_A" / "config.json").write_text(json.dumps({**hand_config("A", sweep / "run_A"), "steps": 2}))
    run_d = write_run(sweep / "run_D", {**hand_config("A", sweep / "run_D"), "seed": 2, "steps": 2}, train,
                      HAND_METRICS[:1])
    with (run_d / "turns.jsonl").open("a") as f:
        f.write('{"run_id": "run_D", "split": "tra')
    result = run_script("ablation_table.py", str(sweep), "--split", "train", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert "note: run_D: turns.jsonl has 1 unreadable line at its end (a write cut short)" in result.stderr
    assert "note: run_D: unfinished, 1 of 2 training steps" in result.stderr
    assert "note: run_D: step 2 unfinished (turn rows without the step's metrics row" in result.stderr
    assert "steps last (run_A: 2; run_D: 1)" in result.stdout
    # step 1 of run D: nothing correct; pooled with run A's step 2 (one 1.0x kernel of two), seeds 0 and 2
    assert "| 2x1 | 50.0% [" in result.stdout and "| 1 | 2 |" in result.stdout

    kept = run_script("ablation_table.py", str(sweep), "--split", "train", "--no-turns", "--include-partial")
    assert kept.returncode == 0, kept.stderr
    assert "note: run_D: step 2 unfinished: included (--include-partial)" in kept.stderr
    assert "steps last (step 2 of every run)" in kept.stdout
    assert "| 2x1 | 100.0% [100.0, 100.0] |" in kept.stdout  # both runs' step 2 hold the 1.0x kernel


def user_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a user error, after checking the exit status and that nothing else was printed."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("script", ["ablation_table.py", "plots.py"])
def test_user_errors_find_runs(tmp_path, sweep, ledger, script):
    out = ["--out", str(tmp_path / "figures")] if script == "plots.py" else []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert user_error(run_script(script, str(empty), *out)) == \
        f"error: {empty}: a directory with no turns.jsonl and no subfolder holding one"
    assert user_error(run_script(script, "nope", "--ledger", str(ledger), *out)) == \
        f"error: nope: not a run directory, not a sweep directory, and no sweep of that name in the ledger {ledger}"
    missing = tmp_path / "no_ledger.jsonl"
    assert user_error(run_script(script, "hand", "--ledger", str(missing), *out)) == (
        f"error: hand: not a run directory, not a sweep directory, and there is no ledger at {missing} to look up "
        "a sweep of that name (--ledger names another)")
    with ledger.open("a") as f:
        f.write(json.dumps({"sweep_name": "gone", "sweep_dir": str(tmp_path / "gone")}) + "\n")
    assert user_error(run_script(script, "gone", "--ledger", str(ledger), *out)) == (
        f"error: gone: the ledger {ledger} puts this sweep in {tmp_path / 'gone'}, which holds no run "
        "(no */turns.jsonl)")
    turns = sweep / "run_A" / "turns.jsonl"
    assert user_error(run_script(script, str(turns), *out)) == \
        f"error: {turns}: a file; pass a run directory (it holds turns.jsonl), a sweep directory or a sweep name"


def test_user_errors_pick_rows(tmp_path, sweep):
    run_b = str(sweep / "run_B")
    assert user_error(run_script("ablation_table.py", run_b, "--split", "train")) == \
        f"error: --split train: no train rows in any of {run_b}"
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "turns.jsonl").write_text("")
    assert user_error(run_script("ablation_table.py", str(blank))) == \
        f"error: no train or eval rows in any of {blank}: their turns.jsonl files hold no rows"
    assert user_error(run_script("ablation_table.py", str(sweep), "--steps", "9:3")) == \
        "error: --steps '9:3': the window ends before it starts"
    assert user_error(run_script("ablation_table.py", str(sweep), "--steps", "first")) == (
        "error: --steps 'first': expected last, all, or a:b (steps a to b, both included; the first training step "
        "is 1)")
    # the eval rows are all of step 5; the training rows of run A are of steps 1 and 2
    assert user_error(run_script("ablation_table.py", str(sweep), "--steps", "6:9")) == \
        "error: --steps 6:9: no eval rows in that window; the runs hold eval rows of steps 5"
    assert user_error(run_script("plots.py", str(sweep), "--split", "train", "--steps", ":0", "--out",
                                 str(tmp_path / "f"))) == \
        "error: --steps :0: no train rows in that window; the runs hold train rows of steps 1, 2"
    assert not (tmp_path / "f").exists()  # nothing written, not even the directory
    assert user_error(run_script("ablation_table.py", str(sweep), "--turns", "0")) == \
        "error: --turns 0: expected 1 or more"
    assert user_error(run_script("ablation_table.py", str(sweep), "--turns", "two")) == \
        "error: argument --turns: invalid int value: 'two' (see ablation_table.py --help)"
    assert user_error(run_script("ablation_table.py", str(sweep), "--resamples", "-1")) == \
        "error: --resamples -1: expected 0 (no intervals) or more"
    assert user_error(run_script("ablation_table.py", str(sweep), "--budget", "0")) == \
        "error: --budget 0: expected a positive number of kernels per task"
    assert user_error(run_script("ablation_table.py", str(sweep), "--budget", "lots")) == \
        "error: argument --budget: invalid int value: 'lots' (see ablation_table.py --help)"
    assert user_error(run_script("ablation_table.py", str(sweep), "--format", "html")) == (
        "error: argument --format: invalid choice: 'html' (choose from 'markdown', 'csv', 'latex') "
        "(see ablation_table.py --help)")
    assert user_error(run_script("plots.py", str(sweep))) == \
        "error: the following arguments are required: --out (see plots.py --help)"


def test_user_errors_unwritable_out(tmp_path, sweep):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert user_error(run_script("ablation_table.py", str(sweep), "--out", str(a_file / "t.md"))) == \
        f"error: --out {a_file / 't.md'}: {a_file} is a file, not a directory"
    assert user_error(run_script("ablation_table.py", str(sweep), "--out", str(a_file / "deeper" / "t.md"))) == \
        f"error: --out {a_file / 'deeper' / 't.md'}: {a_file} is a file, not a directory"
    assert user_error(run_script("ablation_table.py", str(sweep), "--out", str(tmp_path))) == \
        f"error: --out {tmp_path}: a directory; name a file"
    assert user_error(run_script("plots.py", str(sweep), "--out", str(a_file))) == \
        f"error: --out {a_file}: a file, not a directory; name a directory"
    assert user_error(run_script("plots.py", str(sweep), "--out", str(a_file / "figures"))) == \
        f"error: --out {a_file / 'figures'}: {a_file} is a file, not a directory"


def test_internal_errors_keep_their_traceback(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    # rows the analysis cannot read (no task, trajectory or turn): a bug or a corrupt file, not a user error
    (broken / "turns.jsonl").write_text(json.dumps({"split": "eval", "step": 1, "seed": 0}) + "\n")
    result = run_script("ablation_table.py", str(broken))
    assert result.returncode == 1 and "Traceback (most recent call last)" in result.stderr


def test_budget_larger_than_the_runs_hold(sweep):
    # every run holds 2 trajectories x 2 turns per task: budgets 1 (1x1), 2 (1x2, 2x1) and 4 (2x2)
    result = run_script("ablation_table.py", str(sweep), "--budget", "16", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "note: --budget 16 is more than all 3 runs hold: 2 trajectories x 2 turns = 4 kernels per task; "
        "budgets they support (k <= 2, n <= 2): 1, 2, 4"]
    assert ROW_04 in result.stdout.splitlines() and "Fixed budget" not in result.stdout
    # 3 kernels fit in 4, but as no k x n = 3 of the data (3x1, 1x3)
    result = run_script("ablation_table.py", str(sweep), "--budget", "3", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "note: --budget 3 does not split into k trajectories x n turns that all 3 runs hold "
        "(2 trajectories x 2 turns per task); budgets they support (k <= 2, n <= 2): 1, 2, 4"]
    # more turns than the data holds: a note, scored over the turns there are
    result = run_script("ablation_table.py", str(sweep), "--turns", "5", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["note: --turns 5: the eval rows hold at most 2 turns; scored over those"]
    assert ROW_04 in result.stdout.splitlines()


def test_evaluations_of_checkpoints_by_training_gamma(tmp_path):
    # checkpoints trained with 2 x 3, evaluated with 4 x 2 (tests/unit/test_analysis_metrics.py, write_eval_sweep)
    evals = write_eval_sweep(tmp_path / "evals")
    result = run_script("ablation_table.py", str(evals), "--budget", "8", "--no-turns", "--format", "csv")
    assert result.returncode == 0, result.stderr
    sections = csv_sections(result.stdout)
    variants = sections["Variants:"]
    assert list(variants.columns[:2]) == ["gamma", "k x n"]
    assert variants[["gamma", "k x n", "seeds", "correct best@k", "speedup avg@k"]].values.tolist() == [
        [0.4, "4x2", 2, 1.0, 0.5], [1.0, "4x2", 1, 0.0, 0.0]]
    assert sections["Fixed"][["gamma", "4x2 speedup", "4x2 correct"]].values.tolist() == [[0.4, 2.0, 1.0],
                                                                                       [1.0, 0.0, 0.0]]
    # step 30 is the training step behind the weights
    window = run_script("ablation_table.py", str(evals), "--steps", "30:30", "--no-turns").stdout
    last = run_script("ablation_table.py", str(evals), "--no-turns").stdout
    assert window.replace("steps 30:30", "steps last") == last


def test_plots(tmp_path, ledger):
    out = tmp_path / "figures"
    result = run_script("plots.py", "hand", "--ledger", str(ledger), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(out / name) for name in (
        "test_time_scaling.png", "test_time_scaling.csv", "training_curves.png", "training_curves.csv")]
    for name in ("test_time_scaling.png", "training_curves.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 20_000, name
    scaling = pd.read_csv(out / "test_time_scaling.csv")
    # the same numbers as the per-turn table (test_turn_curves_by_hand)
    columns = ["gamma", "k", "turn", "kernels", "correct_best", "speedup_best", "speedup_avg"]
    assert scaling[columns].to_numpy(dtype=float) == pytest.approx(np.array([
        [0.4, 1, 1, 1, 0.375, 0.525, 0.525], [0.4, 2, 1, 2, 0.75, 1.05, 0.525],
        [0.4, 1, 2, 2, 0.625, 0.9, 0.9], [0.4, 2, 2, 4, 0.75, 1.2, 0.9],
        [1.0, 1, 1, 1, 0.5, 0.75, 0.75], [1.0, 2, 1, 2, 1.0, 1.5, 0.75],
        [1.0, 1, 2, 2, 0.75, 1.0, 1.0], [1.0, 2, 2, 4, 1.0, 2.0, 1.0]]))
    training = pd.read_csv(out / "training_curves.csv")
    # only run A trained (seed 0 of the 0.4/constant variant): logged reward and grad norm, not-okay ratio
    # recomputed from its turn rows (step 1 flags T, F; step 2 F, F)
    assert training["run"].unique().tolist() == ["gamma=0.4, normalization=constant, seed=0"]
    assert training["variant"].unique().tolist() == ["gamma=0.4, normalization=constant"]
    assert training[["step", "reward_mean", "grad_norm", "not_okay_ratio", "correct_turn_1", "train_s"]].values.tolist() \
        == [[1, 0.1, 0.5, 0.5, 0.0, 3.0], [2, 0.65, 0.25, 0.0, 0.5, 3.5]]
