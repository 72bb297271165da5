"""trainer=deepspeed on a GPU (skipped elsewhere): two steps of one rank under ZeRO-3, bf16, the optimizer states
offloaded to the CPU and activation checkpointing (set by hand: trainer=deepspeed's auto layout would keep a tiny
model's states on the GPU), then a resume; and 2 ranks on 2 GPUs over NCCL when there are two.

    pytest -m gpu tests/integration/test_deepspeed_gpu.py -s     (KEVIN_EXP_TOKENIZER as in tests/gpu)
"""
from __future__ import annotations

import os

import pytest
import torch

from kevin_exp.records.run_records import read_jsonl
from kevin_exp.trainer.checkpoint import find_checkpoint
from tests.integration.deepspeed_ranks import REPO, free_port

pytestmark = pytest.mark.gpu
pytest.importorskip("deepspeed")

RUN = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "trainer=deepspeed", "trainer.zero_stage=3",
       "trainer.offload_optimizer=cpu", "trainer.offload_params=none", "n_trajectories=4", "n_turns=2",
       "tasks_per_step=2", "rollout.max_new_tokens=16", "trainer.lr=1e-4", "trainer.dist_timeout_s=300"]


def _tokenizer_override() -> list[str]:
    folder = os.environ.get("KEVIN_EXP_TOKENIZER")
    return [f"model.tokenizer_path={folder}"] if folder else []


def _ranks(world: int, run_dir, steps: int) -> None:
    import subprocess
    import sys

    port = free_port()
    procs = []
    for r in range(world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen([sys.executable, str(REPO / "tests/integration/deepspeed_run_worker.py"), str(run_dir),
                                       *RUN, *_tokenizer_override(), f"steps={steps}"], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)


def test_one_rank_trains_on_the_gpu_and_resumes(tmp_path):
    _ranks(1, tmp_path, 1)
    _ranks(1, tmp_path, 2)
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        print({k: m[k] for k in ("loss", "grad_norm", "train_s", "gpu_mem_peak_gb", "host_rss_peak_gb", "train_tokens_per_s", "mfu")})
        assert m["world_size"] == 1 and m["gpu_mem_peak_gb"] > 0
        name = torch.cuda.get_device_name(0)
        assert (m["mfu"] is not None) == any(k in name for k in ("H100", "H200", "A100", "B200", "L40S"))
    assert (find_checkpoint(tmp_path) / "policy.safetensors").is_file()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_train_over_nccl(tmp_path):
    _ranks(2, tmp_path, 2)
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["world_size"] for m in metrics] == [2, 2]
    assert len(read_jsonl(tmp_path / "turns.jsonl")) == 2 * 2 * 4 * 2
