"""The plain progress lines of real runs, as a SLURM log gets them (logger.progress=lines): each training step line
says the step's time, the mean per step and the time to the end of the run; an evaluation counts batches; the SLURM
launcher's wait says how many jobs are done and the time to the end of the sweep."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "rollout.env=synthetic", "rollout.max_new_tokens=4", "logger.progress=lines"]
ELAPSED = r"\[ *\d+s\] "
SPAN = r"\d[\dmhds.]*"  # records.progress.duration: 4.2s, 42s, 5m43s, 2h05m, 1d03h


def _run(module: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _step_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(rf"{ELAPSED}step \d+/\d+: reward", line)]


def test_a_runs_step_lines_say_the_time_per_step_and_the_time_left(tmp_path):
    proc = _run("kevin_exp.train", *TINY, "n_trajectories=2", "n_turns=2", "tasks_per_step=1", "steps=3",
                f"hydra.run.dir={tmp_path / 'run'}")
    steps = _step_lines(proc.stdout)
    assert len(steps) == 3, proc.stdout
    for line in steps[:2]:
        assert re.search(rf" s gen/eval/train; {SPAN} \(mean {SPAN}/step\), ~{SPAN} left$", line), line
    assert re.search(rf"; {SPAN} \(mean {SPAN}/step\)$", steps[2]), steps[2]  # the last: nothing left
    # the first line within a run's first turn comes at once (later ones at most every 30 s)
    assert re.search(rf"^{ELAPSED}step 1/3 turn 1/2: 0/2 generated, 0/2 evaluated; generating 2", proc.stdout, re.M)


def test_an_evaluations_lines_count_batches(tmp_path):
    ids = "tasks.ids=[builtin/level1/1,builtin/level1/2,builtin/level1/3]"
    proc = _run("kevin_exp.evaluate", *TINY, ids, "eval.n_trajectories=2", "eval.n_turns=2", "eval.tasks_per_batch=2",
                f"hydra.run.dir={tmp_path / 'eval'}")
    lines = [line for line in proc.stdout.splitlines() if re.match(ELAPSED, line)]
    assert any(re.fullmatch(rf"{ELAPSED}batch 1/2 turn 1 group 1: generated in [\d.]+ s", line) for line in lines)
    assert any(re.fullmatch(rf"{ELAPSED}batch 1/2 done; {SPAN} \(mean {SPAN}/batch\), ~{SPAN} left", line)
               for line in lines), lines
    assert any(re.fullmatch(rf"{ELAPSED}batch 2/2 done; {SPAN} \(mean {SPAN}/batch\)", line) for line in lines), lines
    assert not any(re.match(rf"{ELAPSED}step ", line) for line in lines), lines


def test_the_slurm_launchers_wait_says_how_many_jobs_are_done_and_the_time_left(tmp_path, capsys):
    """The launcher's polling (hydra_plugins/kevin_exp_launcher) on real submitit jobs: local processes, whose
    state submitit reads from the process rather than from sacct (tests/slurm/ runs it against SLURM)."""
    import submitit

    from hydra_plugins.kevin_exp_launcher.checked_slurm import wait_reporting

    executor = submitit.LocalExecutor(folder=tmp_path / "jobs")
    executor.update_parameters(timeout_min=5)
    jobs = executor.map_array(time.sleep, [0.5, 6.0, 6.0])
    wait_reporting(jobs, poll_s=0.5)
    lines = capsys.readouterr().out.splitlines()
    assert all(job.done() for job in jobs)
    assert re.fullmatch(r"sweep \(.+ in\): 0/3 jobs done, \d running, \d pending", lines[0]), lines
    # once the short job has ended, the time left of the two others comes from its measured time
    assert any(re.fullmatch(rf"sweep \(.+ in\): 1/3 jobs done, 2 running, 0 pending; {SPAN}/job \(mean of 1\), "
                            rf"~{SPAN} left", line) for line in lines), lines
    assert re.fullmatch(rf"sweep \(.+ in\): 3/3 jobs done; {SPAN}/job \(mean of \d\)", lines[-1]), lines
    # a line when the counts change, not one per poll
    assert len(lines) <= 6, lines
