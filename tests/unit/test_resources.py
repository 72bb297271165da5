"""The launch-time resource check: its formulas (docs/scaling.md) term by term, the refusal with its fixes, and the
command that prints an estimate."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.launch.layout import resolve_layout
from kevin_exp.launch.memory_check import (
    candidate_changes,
    check_host_training,
    check_resources,
    fixes_for,
    host_memory_gb,
)
from kevin_exp.launch.resources import (
    CUDA_CONTEXT_GB,
    NCCL_GB,
    RANK_PROCESS_GB,
    MemoryLayout,
    ResourceError,
    estimate,
    estimate_memory,
    layout_of,
)
from tests.helpers import compose_train


def resolved(overrides: list[str]):
    """A composed config with its ``auto`` layout resolved for GPUs, as a launch resolves it."""
    return resolve_layout(compose_train(overrides), on_gpu=True)[0]

REPO = Path(__file__).resolve().parents[2]
KB = "tasks.kernelbench_path=/data/KernelBench"  # composition checks the setting; the folder is not read here
P32 = 32.8e9
# the KV cache these estimates were worked out with (kevin_32b resolves its batch from the memory left: launch/layout.py)
GEN4 = "rollout.generation_batch_size=4"

# QwQ-32B's shape (conf/model/32b.yaml)
QWQ = MemoryLayout(model="32b", params_b=32.8, layers=64, hidden=5120, intermediate=27648, vocab=152064, kv_dim=1024,
                   dtype="bfloat16", backend="deepspeed", zero_stage=3, micro_batch_tokens=8192, logprob_tokens=4096,
                   generation_batch=8, sequence_tokens=32768, world_size=8, ranks_per_node=8, cpus_per_rank=16)


def test_single_process_trainer_counts_weights_gradients_adam_states_and_kv_cache():
    est = estimate_memory(compose_train(["experiment=kevin_32b", KB, GEN4, "trainer=torch"]))
    assert est.weights_gb == pytest.approx(32.8 * 2)  # bf16
    assert est.gradients_gb == est.weights_gb and est.optimizer_gb == 2 * est.weights_gb
    assert est.reference_gb == 0.0 and est.shards == 1  # no KL term, no frozen copy; nothing sharded
    # 4 sequences x 32768 tokens x 64 layers x (K and V) x 8 heads x 128 dims x 2 bytes
    assert est.kv_cache_gb == pytest.approx(4 * 32768 * 64 * 2 * 8 * 128 * 2 / 1e9)
    assert est.generator_gb == 0.0  # the torch learner trains the generator's own model
    with_kl = estimate_memory(compose_train(["experiment=kevin_32b", KB, GEN4, "trainer=torch", "algorithm.kl_coef=0.001"]))
    assert with_kl.reference_gb == est.weights_gb


def test_async_steps_add_a_generation_copy_and_generation_beside_training():
    sync = estimate_memory(compose_train(["experiment=kevin_32b", KB, GEN4, "trainer=torch"]))
    ahead = estimate_memory(compose_train(["experiment=kevin_32b", KB, GEN4, "trainer=torch", "rollout.async_steps=1"]))
    assert ahead.generator_gb == sync.weights_gb  # the next step samples from its own copy while this one trains
    assert ahead.per_gpu_gb == pytest.approx(sync.per_gpu_gb + sync.weights_gb + min(sync.train_phase_gb,
                                                                                     sync.generate_phase_gb))


def test_zero3_divides_bf16_params_grads_and_fp32_adam_over_the_world():
    for world in (8, 16, 32):
        est = estimate(dataclasses.replace(QWQ, world_size=world))
        assert est.weights_gb == pytest.approx(2 * P32 / world / 1e9)
        assert est.gradients_gb == pytest.approx(2 * P32 / world / 1e9)
        assert est.optimizer_gb == pytest.approx(12 * P32 / world / 1e9)
        # beside the partitioned training copy, the in-process generator samples from a whole bf16 model
        assert est.generator_gb == pytest.approx(2 * P32 / 1e9)
        assert est.states_gb == pytest.approx(16 * P32 / world / 1e9 + 2 * P32 / 1e9)
        assert est.shards == world


def test_zero2_keeps_whole_params_on_every_gpu():
    est = estimate(dataclasses.replace(QWQ, zero_stage=2))
    assert est.weights_gb == pytest.approx(2 * P32 / 1e9)
    assert est.optimizer_gb == pytest.approx(12 * P32 / 8 / 1e9)
    assert est.generator_gb == 0.0  # ZeRO-2 trains the generator's own model


def test_offload_moves_the_optimizer_and_params_to_the_host_of_each_node():
    base = estimate(QWQ)
    opt = estimate(dataclasses.replace(QWQ, offload_optimizer="cpu"))
    assert opt.optimizer_gb == 0.0 and opt.weights_gb == base.weights_gb
    # every rank of the node holds its partition of the fp32 states and fp32 gradients in host memory, and
    # DeepSpeed's staging buffers beside them
    assert opt.host_offload_gb == pytest.approx(8 * (12 + 4 + 4) * P32 / 8 / 1e9)
    both = estimate(dataclasses.replace(QWQ, offload_optimizer="cpu", offload_params="cpu"))
    assert both.weights_gb == 0.0
    assert both.host_offload_gb == pytest.approx(opt.host_offload_gb + 8 * 2 * P32 / 8 / 1e9)
    assert both.per_gpu_gb < opt.per_gpu_gb < base.per_gpu_gb
    assert both.host_per_node_gb > base.host_per_node_gb


def test_activations_per_token_per_layer_with_and_without_checkpointing():
    h, f, kv, layers, tokens = 5120, 27648, 1024, 64, 8192
    layer = 6 * h + 2 * kv + 4 * f
    full = estimate(dataclasses.replace(QWQ, activation_checkpointing=False))
    ckpt = estimate(QWQ)
    assert full.activations_gb == pytest.approx(tokens * layer * layers * 2 / 1e9)
    assert ckpt.activations_gb == pytest.approx(tokens * (h * layers + layer) * 2 / 1e9)
    assert ckpt.activations_gb < full.activations_gb / 10
    half = estimate(dataclasses.replace(QWQ, micro_batch_tokens=4096))
    assert half.activations_gb == pytest.approx(ckpt.activations_gb / 2)


def test_log_prob_buffers_grow_with_the_kept_tokens_and_the_vocabulary():
    est = estimate(QWQ)
    assert est.logprobs_gb == pytest.approx(4096 * 152064 * 16 / 1e9)
    assert estimate(dataclasses.replace(QWQ, logprob_tokens=1024)).logprobs_gb == pytest.approx(est.logprobs_gb / 4)


def test_peak_is_the_states_plus_the_larger_phase_plus_cuda_and_nccl():
    est = estimate(QWQ)
    assert est.runtime_gb == CUDA_CONTEXT_GB + NCCL_GB
    assert est.per_gpu_gb == pytest.approx(est.runtime_gb + est.states_gb + est.buffers_gb
                                           + max(est.activations_gb + est.logprobs_gb, est.kv_cache_gb + est.vllm_gb))
    assert estimate(dataclasses.replace(QWQ, world_size=1, ranks_per_node=1)).runtime_gb == CUDA_CONTEXT_GB
    # beside a vLLM engine: no whole copy of the model and no transformers KV cache; the engine's share is the
    # generation phase
    engine = estimate(dataclasses.replace(QWQ, vllm_gb=200.0))
    assert est.generator_gb > 0 and engine.generator_gb == 0 and engine.kv_cache_gb == 0
    assert engine.per_gpu_gb == pytest.approx(est.per_gpu_gb - est.generator_gb - max(est.train_phase_gb, est.generate_phase_gb)
                                              + max(est.train_phase_gb, 200.0))


def test_the_vllm_engine_share_comes_from_its_settings(vllm_double):
    from kevin_exp.launch.resources import VLLM_RUNTIME_GB, layout_of

    base = ["experiment=kevin_7b", "resources=h100x8", KB]
    hf = layout_of(resolved(base))
    assert hf.vllm_gb == 0
    cfg = resolved(base + ["rollout=vllm", "rollout.vllm.gpu_memory_utilization=0.4"])
    assert layout_of(cfg).vllm_gb == pytest.approx(0.4 * cfg.resources.gpu_memory_gb)
    cfg = resolved(base + ["rollout=vllm", "rollout.vllm.gpu_memory_utilization=null",
                           "rollout.vllm.kv_cache_memory_bytes=20000000000"])
    assert layout_of(cfg).vllm_gb == pytest.approx(2 * cfg.model.params_b + 20 + VLLM_RUNTIME_GB)


def test_host_memory_counts_every_rank_of_the_node():
    one = estimate(dataclasses.replace(QWQ, ranks_per_node=1))
    eight = estimate(QWQ)
    assert eight.host_processes_gb == 8 * RANK_PROCESS_GB == 8 * one.host_processes_gb
    assert eight.host_evaluator_gb == pytest.approx(8 * one.host_evaluator_gb)


def test_layout_reads_the_model_shape_the_trainer_and_the_world_from_the_config():
    paper = ["trainer.zero_stage=3", "trainer.offload_optimizer=cpu", "trainer.offload_params=none",
             "trainer.micro_batch_tokens=16384"]
    x = layout_of(compose_train(["experiment=kevin_32b", KB, GEN4, "resources=h200x16", "tasks_per_step=16", *paper]))
    assert (x.layers, x.hidden, x.intermediate, x.vocab, x.kv_dim) == (64, 5120, 27648, 152064, 1024)
    assert (x.world_size, x.ranks_per_node, x.cpus_per_rank) == (16, 8, 16)
    # the paper's trainer, set by hand: ZeRO-3, optimizer states on the CPU, bf16, checkpointed activations
    assert x.sharded and x.zero_stage == 3 and x.offload_optimizer == "cpu" and x.bf16 and x.activation_checkpointing
    # a 16k + 16k sequence is longer than trainer.micro_batch_tokens: it runs alone; log-probs a chunk at a time
    assert x.micro_batch_tokens == 16384 + 16384 and x.logprob_tokens == 1024
    torch = layout_of(compose_train(["experiment=kevin_32b", KB, GEN4, "trainer=torch", "trainer.micro_batch_size=2",
                                     "trainer.logprob_chunk_tokens=4096"]))
    assert not torch.sharded and torch.micro_batch_tokens == 2 * 32768 and torch.logprob_tokens == 4096


def test_32b_on_one_gpu_stops_with_the_numbers_and_the_fix():
    with pytest.raises(ResourceError) as err:
        check_resources(compose_train(["experiment=kevin_32b", KB, GEN4, "trainer=torch"]))
    text = str(err.value)
    assert "model=32b" in text and "GB per GPU against 72 GB usable" in text
    assert "AdamW states 131.2 GB" in text and "fix:" in text and "resources.gpu_memory_gb" in text
    # the fix a user can take: a node profile whose GPUs hold it, under the sharding trainer
    assert "trainer=deepspeed resources=h200x8 (8 GPUs of 141 GB" in text
    assert "larger GPUs" not in text


def test_a_run_on_this_machine_is_checked_against_its_real_gpu_when_that_is_smaller():
    """A 3B shape under one process fits the 80 GB that resources=gpu1 assumes; on a 24 GB GPU here it does not,
    and the refusal names the GPU's real size. A GPU larger than the setting leaves the setting in charge."""
    cfg = resolved(["model=qwen25_3b_random", "rollout.env=synthetic", "trainer=torch"])
    assert check_resources(cfg).per_gpu_gb < 0.9 * 80
    with pytest.raises(ResourceError) as err:
        check_resources(cfg, local_gpu_gb=24.0)
    text = str(err.value)
    assert "against 22 GB usable (90% of this machine's 24 GB GPU; resources.gpu_memory_gb=80 is more than it has)" in text
    assert "fix:" in text
    assert check_resources(cfg, local_gpu_gb=141.0) == check_resources(cfg)


def test_a_model_too_large_for_this_machines_memory_is_refused_when_it_trains_on_the_cpu():
    """No GPU: the policy's states live in host memory, which the check compares with this machine's. A 32B
    shape (weights, gradients and AdamW states alone are over 250 GB) fits no machine that runs these tests; the
    default model fits all of them."""
    big = compose_train(["model=32b", "model.source=random", "rollout.env=synthetic", "trainer.device=cpu"])
    with pytest.raises(ResourceError, match=r"(?s)model=32b .* trains on the CPU here .* does not fit this machine's "
                                            r"memory: its states and process alone take about \d+ GB against "
                                            r"\d+ GB usable .*fix: a smaller model"):
        check_host_training(big)
    small = check_host_training(compose_train(["trainer.device=cpu"]))
    assert small.states_gb + small.host_processes_gb < 10 < host_memory_gb()


def test_every_fix_offered_fits_when_applied():
    budget = 141 * 0.9
    x = dataclasses.replace(QWQ, generation_batch=4)
    fixes = fixes_for(x, budget)
    assert fixes and estimate(x).per_gpu_gb > budget
    offered = [(label, changes) for label, changes in candidate_changes(x) if any(f.startswith(label + " (") for f in fixes)]
    assert len(offered) == len(fixes)
    for _, changes in offered:
        assert estimate(dataclasses.replace(x, **changes)).per_gpu_gb <= budget
    assert any(f.startswith("trainer.offload_optimizer=cpu") for f in fixes)
    # the next node count that fits is named, not a larger one
    [nodes] = [label for label, _ in offered if label.startswith("resources.nodes=")]
    assert not any(estimate(dataclasses.replace(x, world_size=n)).per_gpu_gb <= budget
                   for n in range(16, int(nodes.split("=")[1].split()[0]) * 8, 8))
    # nothing alone fits a 7B on one 80 GB GPU with the one-process trainer: the combination named fits
    lone = MemoryLayout(model="7b", params_b=7.6, layers=28, hidden=3584, intermediate=18944, vocab=152064, kv_dim=512,
                        dtype="bfloat16", backend="torch", activation_checkpointing=False, micro_batch_tokens=32768,
                        logprob_tokens=16384, generation_batch=8, sequence_tokens=32768)
    [combined] = fixes_for(lone, 72)
    assert "trainer.backend=deepspeed" in combined and "together" in combined
    assert float(combined.split("about ")[1].split()[0]) <= 72


def test_a_node_without_enough_host_memory_is_refused():
    cfg = resolved(["experiment=kevin_7b", KB, "resources=h200x8", "resources.mem_gb=64"])
    with pytest.raises(ResourceError, match=r"host memory of one node does not fit: .* resources.mem_gb=64"):
        check_resources(cfg)


def test_small_models_pass_and_the_check_can_be_switched_off():
    check_resources(compose_train(["model=smollm2_135m"]))
    check_resources(resolved(["experiment=kevin_32b", KB, "resources.check=false"]))


def test_the_entry_point_refuses_before_any_step_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "experiment=kevin_32b", "tasks=builtin",
                           f"hydra.run.dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[0].startswith("error: model=32b")
    assert "Traceback" not in proc.stderr and not tmp_path.joinpath("turns.jsonl").exists()


def test_the_estimate_command_prints_each_term_and_the_fixes():
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.launch.memory_report", "experiment=kevin_32b", "resources=h200x8",
                           "trainer.offload_optimizer=none", GEN4],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "trainer.backend=deepspeed (ZeRO-3" in out and "on 8 GPU(s), 8 per node" in out
    assert re.search(rf"optimizer states +{12 * P32 / 8 / 1e9:.1f} GB", out)
    assert "host per node:" in out and "trainer.offload_optimizer=cpu (about 121 GB per GPU)" in out
