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

from tests.unit.test_analysis_metrics import write_hand_sweep

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

    # only run A has training rows; its last step (1): T1 traj0 1.0x, traj1 nothing correct
    result = run_script("ablation_table.py", str(sweep), "--split", "train", "--no-turns")
    assert result.returncode == 0, result.stderr
    assert "note: no train rows in run_B, run_C: left out" in result.stderr
    assert ("| 2x1 | 100.0% [100.0, 100.0] | 50.0% [50.0, 50.0] | 1.00x [1.00, 1.00] | 0.50x [0.50, 0.50] | "
            "100.0% [100.0, 100.0] | 50.0% [50.0, 50.0] | 0.0% [0.0, 0.0] | 0.0% [0.0, 0.0] | 1 | 1 |") in result.stdout


def test_errors_name_the_argument(tmp_path, ledger):
    result = run_script("ablation_table.py", "nope", "--ledger", str(ledger))
    assert result.returncode == 2
    assert f"error: nope: not a run directory, not a sweep directory, and no sweep of that name in the ledger {ledger}" \
        in result.stderr
    result = run_script("ablation_table.py", "hand", "--ledger", str(ledger), "--steps", "9:3")
    assert result.returncode == 2 and "--steps '9:3'" in result.stderr


def test_plots(tmp_path, ledger):
    out = tmp_path / "figures"
    result = run_script("plots.py", "hand", "--ledger", str(ledger), "--out", str(out))
    assert result.returncode == 0, result.stderr
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
    # recomputed from its turn rows (step 0 flags T, F; step 1 F, F)
    assert training["run"].unique().tolist() == ["gamma=0.4, normalization=constant, seed=0"]
    assert training[["step", "reward_mean", "grad_norm", "not_okay_ratio", "correct_turn_1", "train_s"]].values.tolist() \
        == [[0, 0.1, 0.5, 0.5, 0.0, 3.0], [1, 0.65, 0.25, 0.0, 0.5, 3.5]]
