"""A run of several ranks on CPU (gloo), started by `python -m kevin_exp.train` itself (torch's elastic launcher)
or by torchrun: every rank joins the process group, and what is written once per run is written once."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kevin_exp.config import ResourcesConfig
from kevin_exp.launch.threads import local_ranks_sharing_cores, thread_count, usable_cores
from kevin_exp.records.run_records import read_jsonl
from tests.helpers import FEW_TRIALS

REPO = Path(__file__).resolve().parents[2]
# ZeRO-3 over the ranks, as DeepSpeed runs on CPU (fp32, no offload)
RANK_TRAINER = ["trainer=deepspeed", "trainer.bf16=false", "trainer.offload_optimizer=none",
                "trainer.activation_checkpointing=false", "trainer.dist_timeout_s=120"]
# 1 step, 2 tasks (one per rank) x 2 trajectories x 2 turns through the real cpu evaluator
SMOKE = ["experiment=cpu_smoke", "resources=cpu", "steps=1", "tasks_per_step=2", "rollout.max_new_tokens=16",
         "logger.progress=none", *FEW_TRIALS, *RANK_TRAINER]


def _train(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kevin_exp.train", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _assert_one_run_of_two_ranks(run_dir: Path) -> dict:
    assert (run_dir / "config.json").is_file()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["resources"]["ranks_per_node"] == 2 and config["resources"]["nodes"] == 1
    [start] = json.loads((run_dir / "meta.json").read_text())["starts"]
    # rank 0 recorded the world after every rank had joined the process group
    assert start["world_size"] == 2
    assert [r["rank"] for r in start["ranks"]] == [0, 1] and len({r["pid"] for r in start["ranks"]}) == 2
    assert [r["local_rank"] for r in start["ranks"]] == [0, 1]
    turns = read_jsonl(run_dir / "turns.jsonl")
    keys = [(t["step"], t["task_id"], t["trajectory"], t["turn"]) for t in turns]
    assert len(keys) == len(set(keys)) == 2 * 2 * 2  # every row once, both ranks' tasks
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [1]
    return start


def test_the_entry_point_starts_two_cpu_ranks_that_write_one_run(tmp_path):
    sweep, ledger = tmp_path / "sweep", tmp_path / "ledger.jsonl"
    proc = _train("-m", *SMOKE, "resources.ranks_per_node=2", "gamma=0.4", f"hydra.sweep.dir={sweep}",
                  f"hydra.callbacks.ledger.path={ledger}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run_dir] = [p.parent for p in sweep.glob("*/config.json")]
    start = _assert_one_run_of_two_ranks(run_dir)
    assert start["argv"][-1] == f"hydra.run.dir={run_dir}"  # each rank is the same Hydra job, in the point's folder
    assert len(read_jsonl(ledger)) == 1
    assert proc.stdout.count("starting 2 ranks") == 1
    assert proc.stdout.count("job #0:") == 1 and proc.stdout.count(f"records: {run_dir}\n") == 1
    assert not list(sweep.glob("*/wandb_run.json"))


def test_torchrun_ranks_are_joined_not_started_again(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "kevin_exp.train",
         *SMOKE, f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # resources=cpu asks for one rank: the record holds the two torchrun started
    _assert_one_run_of_two_ranks(run_dir)
    assert "starting 2 ranks" not in proc.stdout
    assert "the launcher started 2 ranks" in proc.stdout and proc.stdout.count(f"records: {run_dir}\n") == 1


def test_several_nodes_need_a_cluster_launch_and_evaluation_runs_in_one_process(tmp_path):
    proc = _train(*SMOKE, "resources.nodes=2", "resources.ranks_per_node=2", "tasks_per_step=4", f"hydra.run.dir={tmp_path}/run",
                  timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "resources.nodes=2" in proc.stderr and "cluster=<SLURM profile>" in proc.stderr
    assert not (tmp_path / "run" / "config.json").exists()
    ev = subprocess.run([sys.executable, "-m", "kevin_exp.evaluate", "experiment=cpu_smoke", "resources=cpu",
                         "resources.ranks_per_node=2", f"hydra.run.dir={tmp_path}/eval"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ev.returncode == 2 and "runs in one process" in ev.stderr and "resources.ranks_per_node=1" in ev.stderr


def test_ranks_need_a_trainer_that_spans_them_and_whole_tasks_each(tmp_path):
    torch_trainer = _train("experiment=cpu_smoke", "resources=cpu", "resources.ranks_per_node=2", "tasks_per_step=2",
                           f"hydra.run.dir={tmp_path}/a", timeout=300)
    assert torch_trainer.returncode == 2 and "Traceback" not in torch_trainer.stderr
    assert "trainer.backend=torch: a run of 2 ranks trains with trainer=deepspeed" in torch_trainer.stderr
    uneven = _train(*SMOKE, "resources.ranks_per_node=2", "tasks_per_step=3", f"hydra.run.dir={tmp_path}/b", timeout=300)
    assert uneven.returncode == 2 and "tasks_per_step=3" in uneven.stderr and "multiple of the world size" in uneven.stderr
    # refused before any rank started
    assert "starting 2 ranks" not in torch_trainer.stdout + uneven.stdout
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_more_ranks_than_gpus_is_refused():
    from kevin_exp.settings_checks import check_settings

    assert check_settings(ResourcesConfig(gpus_per_node=8, ranks_per_node=8)) == []
    [problem] = check_settings(ResourcesConfig(gpus_per_node=2, ranks_per_node=4))
    assert problem.startswith("ranks_per_node=4: one rank per GPU, so at most gpus_per_node=2")


def test_the_ranks_of_a_node_split_its_cores():
    cores = usable_cores()
    wide = ResourcesConfig(cpus_per_task=1024)
    assert thread_count(wide, env={}) == cores
    assert thread_count(wide, env={"LOCAL_WORLD_SIZE": "2"}) == max(1, cores // 2)
    assert thread_count(ResourcesConfig(cpus_per_task=1), env={"LOCAL_WORLD_SIZE": "2"}) == 1
    # SLURM bound each task to its own cores: they are this rank's alone
    bound = {"LOCAL_WORLD_SIZE": "8", "SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": "0x3,0xC"}
    assert local_ranks_sharing_cores(bound) == 1 and thread_count(wide, env=bound) == cores
