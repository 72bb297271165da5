"""One kind of user error, one handler per entry point: every mistake below is one line on stderr that names
the setting or argument and the fix, exit status 2, no traceback, and nothing written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
TINY = ["model=tiny", "rollout.env=synthetic", "logger.progress=none"]


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _assert_user_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _kernelbench_with_wrong_layout(tmp_path: Path) -> Path:
    root = tmp_path / "KernelBench-checkout"
    (root / "level1").mkdir(parents=True)  # level folders at the top, not under KernelBench/
    return root


TRAIN_CASES = {
    "unknown key": (["gama=0.3"], ["gama: no such setting", "did you mean gamma?"]),
    "bad value": (["gamma=1.5"], ["gamma=1.5", "expected a number in [0, 1]"]),
    "wrong type": (["steps=many"], ["steps=many", "expected a value of type int"]),
    "unknown option": (["model=13b"], ["model=13b: no such option", "tiny"]),
    "backend not installed": (["rollout=vllm"], ["rollout.backend=vllm: vLLM is not installed",
                                                 "pip install -e '.[vllm]'"]),
    "unknown task id": (["tasks.ids=[nope]"], ["unknown problem id(s) 'nope'", "builtin/level1/1"]),
    "sweep point": (["-m", "gamma=0.0,2.0"], ["gamma=2.0: expected a number in [0, 1]", "in the sweep point gamma=2.0"]),
    "list without -m": (["gamma=0.1,0.2"], ["gamma=0.1,0.2: a list of values needs -m"]),
    # slips that used to run something else with exit 0
    "sweep file without -m": (["sweep=normalization"], ["sweep=normalization: a sweep needs -m",
                                                        "python -m kevin_exp.train -m sweep=normalization"]),
    "appended key no setting reads": (["+gama=0.3"], ["+gama=0.3: no setting is named gama", "did you mean gamma?"]),
    "more tasks a step than the pool has": (["tasks_per_step=100"], ["tasks_per_step=100: the task pool has",
                                                                     "or fewer"]),
    "a group of one sample": (["n_trajectories=1", "n_turns=1"], ["n_trajectories=1 n_turns=1", "advantage is always 0",
                                                                 "n_trajectories=2 or more"]),
}


@pytest.mark.parametrize("case", sorted(TRAIN_CASES))
def test_train_refuses_a_bad_setting_in_one_line_before_writing_anything(tmp_path, case):
    overrides, fragments = TRAIN_CASES[case]
    t0 = time.monotonic()
    flags = [o for o in overrides if o.startswith("-")]
    proc = _run(tmp_path, "-m", "kevin_exp.train", *flags, *TINY, *[o for o in overrides if o not in flags])
    _assert_user_error(proc, *fragments)
    assert time.monotonic() - t0 < 60  # long before any model, compiler or cluster would be touched
    assert not (tmp_path / "outputs").exists(), "a refused launch leaves no run folder or ledger line"



@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without a GPU")
def test_a_gpu_device_on_a_machine_without_one_is_refused_before_the_run_folder_exists(tmp_path):
    run_dir = tmp_path / "run"
    proc = _run(tmp_path, "-m", "kevin_exp.train", *TINY, "trainer.device=cuda", f"run_dir={run_dir}")
    _assert_user_error(proc, "trainer.device=cuda: no CUDA GPU is visible on this machine", "trainer.device=auto",
                       "trainer.device=cpu")
    assert not run_dir.exists() and not (tmp_path / "outputs").exists(), "no run folder, lock or ledger line"

def _under_a_file(tmp_path: Path, name: str) -> Path:
    """A path where no folder or file can be made, for any user: the tests may run as root, whom a chmod does not
    stop, but nobody can make anything inside a regular file."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    return blocker / name


@pytest.mark.parametrize("entry", ["kevin_exp.train", "kevin_exp.evaluate"])
@pytest.mark.parametrize("key", ["run_dir", "hydra.run.dir"])
def test_an_unwritable_run_folder_is_refused_before_anything_is_written(tmp_path, entry, key):
    target = _under_a_file(tmp_path, "run")
    proc = _run(tmp_path, "-m", entry, *TINY, f"{key}={target}")
    _assert_user_error(proc, f"{key}={target}: {tmp_path / 'a_file'} is a file", f"give {key}=<a folder")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"], "no run folder, no Hydra folder"


@pytest.mark.parametrize("entry", ["kevin_exp.train", "kevin_exp.evaluate"])
@pytest.mark.parametrize("key", ["hydra.sweep.dir", "hydra.callbacks.ledger.path"])
def test_an_unwritable_sweep_folder_or_ledger_is_refused_and_appends_no_ledger_line(tmp_path, entry, key):
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"sweep_name": "earlier"}\n')
    paths = {"hydra.sweep.dir": tmp_path / "sweep", "hydra.callbacks.ledger.path": ledger}
    paths[key] = _under_a_file(tmp_path, Path(paths[key]).name)
    proc = _run(tmp_path, "-m", entry, "-m", *TINY, "seed=0,1", *[f"{k}={v}" for k, v in paths.items()])
    _assert_user_error(proc, f"{key}={paths[key]}: {tmp_path / 'a_file'} is a file", f"give {key}=<a")
    assert ledger.read_text() == '{"sweep_name": "earlier"}\n', "a refused sweep appends no ledger line"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "ledger.jsonl"]


def test_the_ledger_callback_appends_no_line_for_a_sweep_whose_folder_cannot_be_made(tmp_path, capsys):
    """The same refusal where Hydra calls the callback, for a launch that did not go through the entry points."""
    from kevin_exp.records.ledger import SweepLedger

    ledger, sweep = tmp_path / "ledger.jsonl", _under_a_file(tmp_path, "sweep")
    config = OmegaConf.create({"sweep_name": None, "hydra": {"sweep": {"dir": str(sweep)}, "sweeper": {},
                                                             "overrides": {"task": []}}})
    with pytest.raises(SystemExit) as stopped:
        SweepLedger(str(ledger)).on_multirun_start(config)
    assert stopped.value.code == 2 and not ledger.exists()
    assert capsys.readouterr().err.startswith(f"error: hydra.sweep.dir={sweep}: {tmp_path / 'a_file'} is a file")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_folder_holding_another_run_is_refused_and_its_own_run_resumes_there(tmp_path):
    run = [*TINY, "n_trajectories=2", "n_turns=2", "tasks_per_step=1", "rollout.max_new_tokens=4", "steps=1"]
    first = _run(tmp_path, "-m", "kevin_exp.train", *run)
    assert first.returncode == 0, first.stderr[-2000:]
    [folder] = (tmp_path / "outputs" / "runs").iterdir()
    before = _files(folder)
    assert ".hydra/overrides.yaml" in before and "config.json" in before
    # another run (other settings) pointed at the first one's folder
    other = _run(tmp_path, "-m", "kevin_exp.train", *run, "gamma=0.0", f"run_dir={folder}")
    _assert_user_error(other, f"run_dir={folder}: {folder} holds another run", "only this run has: gamma=0.0",
                       "another run_dir", "delete that folder")
    assert _files(folder) == before, "the first run's records and Hydra files are as they were"
    # the same settings with a run_dir of their own: Hydra's files go with that run's records, not into the folder
    # named by the (same) overrides, the first run's
    elsewhere = tmp_path / "elsewhere"
    moved = _run(tmp_path, "-m", "kevin_exp.train", *run, f"run_dir={elsewhere}")
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert _files(folder) == before
    assert {".hydra/overrides.yaml", "train.log", "config.json"} <= set(_files(elsewhere))
    # the first run itself, relaunched into its folder (with another launch setting), resumes there
    again = _run(tmp_path, "-m", "kevin_exp.train", *run, "resources=cpu", f"run_dir={folder}")
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(json.loads((folder / "meta.json").read_text())["starts"]) == 2


def test_a_kernelbench_folder_with_the_wrong_layout_names_the_folder_and_the_fix(tmp_path):
    root = _kernelbench_with_wrong_layout(tmp_path)
    proc = _run(tmp_path, "-m", "kevin_exp.train", *TINY, "tasks=kernelbench", f"tasks.kernelbench_path={root}")
    _assert_user_error(proc, f"tasks.kernelbench_path={root}", "level1 holds no problem files")
    assert not (tmp_path / "outputs").exists()


def test_evaluate_refuses_a_checkpoint_that_does_not_exist(tmp_path):
    proc = _run(tmp_path, "-m", "kevin_exp.evaluate", *TINY, f"checkpoint={tmp_path}/no_such_run")
    _assert_user_error(proc, f"checkpoint={tmp_path}/no_such_run")
    assert not (tmp_path / "outputs").exists()


def test_an_unreachable_cluster_is_named_with_the_fix(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    proc = _run(REPO, "-m", "kevin_exp.train", "-m", "cluster=local_slurm", "resources=cpu", "experiment=cpu_smoke",
                f"hydra.sweep.dir={tmp_path}/sweep", f"hydra.callbacks.ledger.path={tmp_path}/ledger.jsonl", env=env)
    _assert_user_error(proc, "cluster=local_slurm", "sinfo not found", "local-cluster.sh start")


def test_the_evaluator_cli_refuses_a_missing_file(tmp_path):
    proc = _run(tmp_path, "-m", "kevin_exp.bench", "--reference", str(tmp_path / "ref.py"), "--candidate",
                str(tmp_path / "cand.py"))
    _assert_user_error(proc, f"--reference {tmp_path}/ref.py: no such file")


def test_the_analysis_scripts_refuse_a_folder_with_no_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    for script in ("analysis/ablation_table.py", "analysis/plots.py"):
        extra = ["--out", str(tmp_path / "plots")] if script.endswith("plots.py") else []
        proc = _run(REPO, str(REPO / script), str(tmp_path / "empty"), *extra)
        _assert_user_error(proc, f"{tmp_path}/empty")


def test_show_refuses_a_folder_without_transcripts(tmp_path):
    proc = _run(tmp_path, "-m", "kevin_exp.show", str(tmp_path))
    _assert_user_error(proc, str(tmp_path))


def test_cfg_job_resolve_prints_the_resolved_config(tmp_path):
    proc = _run(tmp_path, "-m", "kevin_exp.train", "--cfg", "job", "--resolve", "gamma=0.9")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gamma: 0.9" in proc.stdout and "run_dir: null" in proc.stdout
    assert not (tmp_path / "outputs").exists()
