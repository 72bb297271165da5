"""A local sweep ends in one report (analysis/report.py, written by the launcher's end hook), and every section
of it agrees with the runs' own records; a sweep with a run missing and a run cut short says so."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from kevin_exp.analysis.report import SECTIONS
from kevin_exp.records.run_records import read_jsonl

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "n_trajectories=2", "n_turns=2",
         "tasks_per_step=1", "rollout.max_new_tokens=4", "steps=2"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("report")
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "-m", *SMALL, "gamma=0.0,1.0", "seed=0,1",
                           f"hydra.sweep.dir={root}/sweep", f"hydra.callbacks.ledger.path={root}/ledger.jsonl"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "sweep", root / "ledger.jsonl", proc.stdout


def section(report: str, title: str) -> str:
    start = report.index(f"## {title}\n")
    end = report.find("\n## ", start + 1)
    return report[start:end if end > 0 else None]


def table_row(text: str, *first_cells: str) -> list[str]:
    prefix = "| " + " | ".join(first_cells) + " |"
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def runs_of(sweep_dir: Path) -> dict[tuple[float, int], Path]:
    runs = {}
    for run_dir in sweep_dir.iterdir():
        if (run_dir / "config.json").is_file():
            config = json.loads((run_dir / "config.json").read_text())
            runs[(config["gamma"], config["seed"])] = run_dir
    return runs


def correct_avg(run_dirs: list[Path], step: int) -> float:
    """Kevin's avg@k correctness from the rows: per trajectory, correct on any turn; mean over trajectories,
    then tasks, then seeds."""
    per_seed = []
    for run_dir in run_dirs:
        rows = pd.DataFrame(read_jsonl(run_dir / "turns.jsonl"))
        rows = rows[(rows["split"] == "train") & (rows["step"] == step)]
        trajectories = rows.groupby(["task_id", "trajectory"])["correct"].any()
        per_seed.append(trajectories.groupby(level="task_id").mean().mean())
    return sum(per_seed) / len(per_seed)


def test_a_local_sweep_ends_in_a_report_that_agrees_with_its_records(sweep):
    sweep_dir, ledger, stdout = sweep
    report_path = sweep_dir / "report" / "report.md"
    assert stdout.strip().splitlines()[-1] == f"report: {report_path}"  # the launcher's last line names it
    report = report_path.read_text()
    assert [report.index(f"## {title}\n") for title in SECTIONS] == sorted(report.index(f"## {t}\n") for t in SECTIONS)
    runs = runs_of(sweep_dir)
    assert len(runs) == 4

    [entry] = read_jsonl(ledger)
    made = section(report, "How the runs were made")
    assert entry["command"] in made and json.dumps(entry, sort_keys=True) in made
    meta = json.loads((runs[(0.0, 0)] / "meta.json").read_text())
    assert f"commit: {meta['git']['commit'][:12]}" in made
    assert f"machine: {meta['host']}: {meta['cpus']} CPUs" in made and f"torch {meta['versions']['torch']}" in made

    settings = section(report, "Settings")
    assert "Vary: `gamma`, `seed`" in settings
    assert "\nn_turns: 2\n" in settings and "\nsteps: 2\n" in settings and "\ngamma:" not in settings

    table1 = section(report, "Table 1")
    assert "steps last (step 2 of every run)" in table1
    for gamma in (0.0, 1.0):
        row = table_row(table1, f"{gamma:.1f}", "2x2")
        expected = correct_avg([runs[(gamma, 0)], runs[(gamma, 1)]], step=2)
        assert row[3].startswith(f"{100 * expected:.1f}%") and row[-1] == "2"  # correct avg@k; 2 seeds
    assert "Fixed budget of 4 kernels per task" in section(report, "Table 2")
    assert "| 1.0 | 2 | 2 | 4 |" in section(report, "Per turn")

    figures = section(report, "Figures")
    for name in ("test_time_scaling", "training_curves"):
        assert f"![{name}]({name}.png)" in figures
        assert (sweep_dir / "report" / f"{name}.png").stat().st_size > 10_000
        assert (sweep_dir / "report" / f"{name}.csv").is_file()

    times, integrity = section(report, "Runs"), section(report, "Reward integrity")
    for (gamma, seed), run_dir in runs.items():
        label = f"gamma={gamma:.1f}, seed={seed}"
        metrics = read_jsonl(run_dir / "metrics.jsonl")
        row = table_row(times, label)
        assert row[1] == "2 of 2" and row[2] == f"{sum(m['step_s'] for m in metrics) / 60:.1f} min"
        assert row[3] == "0.00"  # no GPU
        assert row[4].startswith(f"{sum(m['generate_s'] for m in metrics):.0f} s")
        rows = read_jsonl(run_dir / "turns.jsonl")
        counts = table_row(integrity, label)
        assert counts[1] == str(sum(r["status"] != "format_error" for r in rows))
        assert counts[2] == str(sum(r["status"] == "suspect" for r in rows))
        assert counts[5] == str(sum(r["status"] == "infra_error" for r in rows))
    assert "- nothing: every run of the sweep is here" in section(report, "What is missing")


def test_the_report_names_an_absent_run_a_missing_seed_and_a_run_cut_short(sweep, tmp_path):
    sweep_dir, ledger, _ = sweep
    copy = tmp_path / "sweep"
    subprocess.run(["cp", "-r", str(sweep_dir), str(copy)], check=True)
    runs = runs_of(copy)
    subprocess.run(["rm", "-r", str(runs[(1.0, 1)])], check=True)
    cut = runs[(0.0, 1)]  # stopped inside step 2: its turn rows are there, its metrics row is not
    (cut / "metrics.jsonl").write_text(json.dumps(read_jsonl(cut / "metrics.jsonl")[0]) + "\n")
    entry = {**read_jsonl(ledger)[0], "sweep_dir": str(copy)}
    (tmp_path / "ledger.jsonl").write_text(json.dumps(entry) + "\n")

    proc = subprocess.run([sys.executable, "analysis/report.py", str(copy), "--out", str(tmp_path / "out"),
                           "--ledger", str(tmp_path / "ledger.jsonl")], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "out" / "report.md").read_text()
    missing = section(report, "What is missing")
    assert "- absent: the run gamma=1.0, seed=1 of the launched sweep" in missing
    assert "- gamma=1.0: seed 1 absent" in missing
    assert f"- {cut.name}: unfinished, 1 of 2 training steps" in missing
    assert f"- {cut.name}: step 2 unfinished" in missing
    assert f"{cut.name}: 1" in section(report, "Table 1")  # the step it used
    assert table_row(section(report, "Runs"), "gamma=0.0, seed=1")[1] == "1 of 2"
