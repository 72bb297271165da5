"""Training throughput of trainer=deepspeed on one GPU: a Qwen2.5-3B-shaped model under ZeRO-3 and bf16.

    python benchmarks/train_mfu.py --out DIR [--budget-s 480] [--profile]
    python benchmarks/train_mfu.py --out DIR --smoke          # a tiny model on the CPU: checks the script only

The model is random-initialised from Qwen2.5-3B's shape (hidden 2048, 36 layers, 16 heads, 2 KV heads,
intermediate 11008, vocabulary 151936, tied embeddings; ~3.1B parameters). Each sequence is 4,096 tokens
(a 1,024-token prompt and a 3,072-token response: the loss covers the response), scored the way the learner
scores them (``kevin_exp.trainer.logprobs.response_logprobs``: decoder -> output layer chunk by chunk -> fp32
log-softmax -> target token, each chunk recomputed in the backward pass; then the clipped surrogate loss),
through a DeepSpeed engine built from the config ``trainer=deepspeed`` generates.

For each configuration of a small grid (micro-batch sizes, the share of decoder layers checkpointed --
``trainer.checkpoint_layers``, 0 for none --, optimizer offload none/cpu, ZeRO-3 parameter persistence, ZeRO-2), in its
own process (with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, recorded) so an OOM or a crash costs
only that configuration, it measures:
- forward+backward of one micro-batch (no optimizer step; the mean of a few after a warm-up one),
- the optimizer step: a gradient step's last micro-batch (reduction, clipping, AdamW, the updated
  parameters written back) minus one forward+backward,
- a whole gradient step of ``--step-tokens`` tokens: accumulated micro-batches plus the optimizer step,
and reports tokens/s, MFU = 6 x parameters x tokens / time / 989e12 (H100 SXM / H200 dense bf16 peak; the
table in kevin_exp/run/throughput.py names others), GPU memory and the host's peak RSS.
GPU memory: ``gpu_resident_gb`` is what is allocated before the timed micro-batches (parameters, gradients and,
without offload, optimizer states); the peak statistics are reset there, so ``gpu_peak_gb`` / ``gpu_peak_reserved_gb``
are the forward+backward micro-batches' own peaks (allocated / held by the allocator), and
``gpu_step_peak_gb`` the peak of the gradient step's last micro-batch with its optimizer step (reset again before it);
``alloc_retries`` counts the allocator's cache flushes (a sign of memory pressure).
Activation checkpointing recomputes the forward of the checkpointed layers (up to 8N FLOPs per token done, 6N
counted), as MFU conventionally does.

The grid stops launching configurations once ``--budget-s`` is spent; the best forward+backward MFU is
printed at the end. ``--profile`` re-runs the best configuration under torch's profiler and writes the top
operators by GPU time to DIR/profile.txt.

Results: DIR/results.jsonl (one row per configuration, with ``status``: ok, oom, failed or timeout) and
DIR/summary.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

QWEN25_3B = dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                 intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=512, tie_word_embeddings=True, max_position_embeddings=256)
PEAK_BF16 = 989e12
# ZeRO-3 keeps parameters below this size whole on every rank; above the model's largest, nothing is re-gathered
# (on one GPU there is nothing to shard, so this shows what ZeRO-3's gather hooks cost)
PERSIST_ALL = int(1e12)


# set in every configuration's process (before CUDA starts): fewer cache flushes under memory pressure
ALLOC_CONF = "expandable_segments:True"


def default_grid() -> list[dict]:
    """Most promising first. CPU offload frees the optimizer states (~37 GB at 3B) for activations; a layer left
    out of checkpointing keeps ~0.24 GB per 4,096-token sequence (from a measured micro-batch of 2 without
    checkpointing), so at 16 sequences a quarter of the layers (9) adds ~35 GB and half of them (18) ~69 GB, on the
    edge of 80 GB. Per micro-batch there is also a fixed cost (~1 s at 3B: mb4, mb8 and mb16 fit a + b x mb), which
    larger micro-batches amortise and ZeRO-3 parameter persistence may remove. Offload configurations come first:
    the first builds DeepSpeed's CPU Adam (once per machine)."""
    def cfg(mb: int, ckpt: float, offload: str = "none", persist: bool = False, stage: int = 3) -> dict:
        return {"micro_batch": mb, "checkpoint_layers": ckpt, "offload": offload, "persist": persist, "stage": stage}

    # ZeRO-2 on one GPU gathers nothing per micro-batch (the whole bf16 model stays on the GPU, 6 GB at 3B)
    return [cfg(16, 0.75, "cpu"), cfg(16, 0.75, "cpu", stage=2), cfg(16, 1.0, "cpu", stage=2), cfg(16, 0.5, "cpu"),
            cfg(16, 0.75, "cpu", persist=True), cfg(24, 1.0, "cpu"), cfg(8, 0.5), cfg(16, 1.0, "cpu"),
            cfg(24, 0.75, "cpu"),
            # a few layers left out of checkpointing: 0.75 ran out of memory at mb16 (~5.6 GB per layer left out)
            cfg(16, 0.875, "cpu", stage=2), cfg(16, 0.8, "cpu", stage=2)]


def name_of(c: dict) -> str:
    ck = c["checkpoint_layers"]
    return (f"mb{c['micro_batch']}_{f'ckpt{ck:g}' if ck > 0 else 'nockpt'}_offload-{c['offload']}"
            f"{'_persist' if c['persist'] else ''}{'_zero2' if c['stage'] == 2 else ''}")


# ---------------------------------------------------------------------------------------------- one configuration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(c: dict, args: argparse.Namespace) -> dict:
    import torch

    smoke = args.smoke
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if smoke:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import transformers

    from kevin_exp.config import TrainerConfig
    from kevin_exp.models.loading import _dtype_kwarg, _enable_checkpointing
    from kevin_exp.models.partial_checkpointing import limit_checkpointing
    from kevin_exp.rl.loss import clipped_policy_loss
    from kevin_exp.trainer.ds_config import generate_deepspeed_config, merged
    from kevin_exp.trainer.logprobs import pack, response_logprobs

    device = torch.device("cpu" if smoke else "cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.distributed.init_process_group("gloo" if smoke else "nccl", rank=0, world_size=1)
    dtype = torch.float32 if smoke else torch.bfloat16
    attn = "sdpa"
    if not smoke:
        try:
            from transformers.utils import is_flash_attn_2_available

            attn = "flash_attention_2" if is_flash_attn_2_available() else "sdpa"
        except ImportError:
            pass
    config = transformers.Qwen2Config(**(TINY if smoke else QWEN25_3B))
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, **_dtype_kwarg(dtype))
    n_params = sum(p.numel() for p in model.parameters())
    checkpointed: list[int] = []
    if c["checkpoint_layers"] > 0:
        _enable_checkpointing(model)
        checkpointed = limit_checkpointing(model, c["checkpoint_layers"])
    model.train()
    seq, prompt_len = args.seq, args.prompt
    resp_len = seq - prompt_len
    mb = c["micro_batch"]
    trainer = TrainerConfig(backend="deepspeed", zero_stage=c["stage"], offload_optimizer=c["offload"],
                            bf16=not smoke, lr=1e-6,
                            grad_clip=1.0, micro_batch_tokens=mb * seq, logprob_chunk_tokens=args.chunk_tokens,
                            activation_checkpointing=c["checkpoint_layers"] > 0,
                            checkpoint_layers=c["checkpoint_layers"] if c["checkpoint_layers"] > 0 else 1.0)
    ds_config = generate_deepspeed_config(trainer, world_size=1)
    if c["persist"]:
        ds_config = merged(ds_config, {"zero_optimization": {"stage3_param_persistence_threshold": PERSIST_ALL}})
    if smoke and c["offload"] == "cpu":
        ds_config = merged(ds_config, {"zero_force_ds_cpu_optimizer": False,
                                       "optimizer": {"params": {"torch_adam": True}}})
    t0 = time.perf_counter()
    engine, *_ = deepspeed.initialize(model=model, config=ds_config, model_parameters=model.parameters())
    init_s = time.perf_counter() - t0

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, config.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(mb)]
    responses = [torch.randint(10, config.vocab_size, (resp_len,), generator=g).tolist() for _ in range(mb)]
    batch = pack(prompts, responses, 0, device)
    adv = torch.randn(mb, generator=g).to(device)
    accumulation = max(1, args.step_tokens // (mb * seq))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def micro(boundary: bool) -> float:
        sync()
        t = time.perf_counter()
        engine.set_gradient_accumulation_boundary(boundary)
        logp, _ = response_logprobs(engine, batch, chunk_tokens=args.chunk_tokens)
        res = clipped_policy_loss(logp, logp.detach(), adv, batch.mask, "token", resp_len,
                                  total_sequences=mb * accumulation, total_tokens=mb * accumulation * resp_len)
        engine.backward(res.loss)
        engine.step()
        sync()
        return time.perf_counter() - t

    if args.profile_run:
        return profile(engine, micro, args)
    cuda = device.type == "cuda"
    first_s = micro(False)  # warm-up: allocator, kernels' autotuning, ZeRO-3's trace
    if cuda:
        resident_gb = torch.cuda.memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    fwd_bwd = [micro(False) for _ in range(args.measure)]
    if cuda:
        peak_gb = torch.cuda.max_memory_allocated(device) / 2**30
        peak_reserved_gb = torch.cuda.max_memory_reserved(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    boundary_s = micro(True)
    step_peak_gb = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0
    retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) if cuda else 0
    if not cuda:
        resident_gb = peak_gb = peak_reserved_gb = 0.0
    fb = sum(fwd_bwd) / len(fwd_bwd)
    opt_s = max(0.0, boundary_s - fb)
    step_s = accumulation * fb + opt_s
    tokens = mb * seq
    return {
        "status": "ok", "params": n_params, "attn": attn, "layers_checkpointed": len(checkpointed),
        "layers": config.num_hidden_layers, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "init_s": init_s, "first_micro_s": first_s,
        "fwd_bwd_s": fb, "fwd_bwd_tokens_per_s": tokens / fb, "fwd_bwd_mfu": 6 * n_params * tokens / fb / PEAK_BF16,
        "optimizer_step_s": opt_s, "step_tokens": accumulation * tokens, "step_s": step_s,
        "step_tokens_per_s": accumulation * tokens / step_s, "step_mfu": 6 * n_params * accumulation * tokens / step_s / PEAK_BF16,
        "gpu_resident_gb": resident_gb, "gpu_peak_gb": peak_gb, "gpu_peak_reserved_gb": peak_reserved_gb,
        "gpu_step_peak_gb": step_peak_gb, "alloc_retries": retries,
        "host_rss_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def profile(engine, micro, args: argparse.Namespace) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    micro(False)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch_profile(activities=activities, record_shapes=False) as prof:
        micro(False)
        micro(False)
        micro(True)
    averages = prof.key_averages()
    tables = []
    for key in ("self_cuda_time_total", "self_device_time_total", "cuda_time_total", "self_cpu_time_total"):
        try:
            tables.append(f"== top operators by {key}\n" + averages.table(sort_by=key, row_limit=40))
        except (AttributeError, KeyError, ValueError, RuntimeError):
            continue
        if len(tables) == 2 or key == "self_cpu_time_total":
            break
    if "self_cpu_time_total" not in "".join(tables):
        tables.append("== top operators by self_cpu_time_total\n" + averages.table(sort_by="self_cpu_time_total", row_limit=25))
    Path(args.out, "profile.txt").write_text("\n\n".join(tables))
    return {"status": "ok", "profile": str(Path(args.out, "profile.txt"))}


def child_main(args: argparse.Namespace) -> None:
    c = json.loads(args.one)
    result_file = Path(args.out) / f"{name_of(c)}{'.profile' if args.profile_run else ''}.json"
    try:
        result = run_one(c, args)
    except Exception as e:  # noqa: BLE001  (an OOM, or any failure, is this configuration's result)
        oom = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
        result = {"status": "oom" if oom else "failed", "error": f"{type(e).__name__}: {str(e)[:500]}"}
    result_file.write_text(json.dumps({**c, "name": name_of(c), **result}))
    sys.stdout.flush()
    os._exit(0)  # skip DeepSpeed's and NCCL's teardown (a hang there would cost the budget)


# ---------------------------------------------------------------------------------------------- the grid


def launch(c: dict, args: argparse.Namespace, timeout: float, profile_run: bool = False) -> dict:
    out = Path(args.out)
    cmd = [sys.executable, __file__, "--out", str(out), "--one", json.dumps(c), "--seq", str(args.seq), "--prompt",
           str(args.prompt), "--step-tokens", str(args.step_tokens), "--chunk-tokens", str(args.chunk_tokens),
           "--measure", str(args.measure), *(["--smoke"] if args.smoke else []),
           *(["--profile-run"] if profile_run else [])]
    result_file = out / f"{name_of(c)}{'.profile' if profile_run else ''}.json"
    result_file.unlink(missing_ok=True)
    log = out / f"{name_of(c)}{'.profile' if profile_run else ''}.log"
    t = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF})
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
    wall = time.perf_counter() - t
    if result_file.is_file():
        return {**json.loads(result_file.read_text()), "wall_s": wall}
    tail = log.read_text()[-1500:] if log.is_file() else ""
    status = "timeout" if wall >= timeout else "failed"
    return {**c, "name": name_of(c), "status": status, "wall_s": wall, "error": tail}


def describe(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['name']:<40} {r['status']:<8} {r.get('error', '')[:160]!r}"
    return (f"{r['name']:<40} fwd+bwd {r['fwd_bwd_s']:7.3f} s {r['fwd_bwd_tokens_per_s']:9.0f} tok/s MFU "
            f"{100 * r['fwd_bwd_mfu']:5.1f}% | opt step {r['optimizer_step_s']:6.2f} s | step of {r['step_tokens']} tok "
            f"{r['step_tokens_per_s']:8.0f} tok/s MFU {100 * r['step_mfu']:5.1f}% | GPU resident {r['gpu_resident_gb']:5.1f} "
            f"fwd+bwd peak {r['gpu_peak_gb']:5.1f} (reserved {r['gpu_peak_reserved_gb']:5.1f}) step peak "
            f"{r['gpu_step_peak_gb']:5.1f} GB, {r['alloc_retries']} cache flushes | RSS {r['host_rss_peak_gb']:5.1f} GB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting configurations after this long")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens of each sequence (no loss on them)")
    ap.add_argument("--step-tokens", type=int, default=262144, help="tokens of one gradient step (64 sequences)")
    ap.add_argument("--chunk-tokens", type=int, default=4096, help="trainer.logprob_chunk_tokens")
    ap.add_argument("--measure", type=int, default=3, help="timed micro-batches per configuration")
    ap.add_argument("--profile", action="store_true", help="profile the best configuration (DIR/profile.txt)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="run only these configurations of the grid, by name (e.g. mb16_ckpt1_offload-cpu_zero2)")
    ap.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (checks this script)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--profile-run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.seq, args.prompt, args.step_tokens, args.chunk_tokens = 64, 16, 256, 32
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.one:
        child_main(args)
        return
    grid = default_grid()
    if args.smoke:
        grid = [{"micro_batch": 2, "checkpoint_layers": ck, "offload": off, "persist": persist, "stage": stage}
                for ck, off, persist, stage in ((0.5, "cpu", False, 3), (1.0, "cpu", True, 3), (0.0, "none", False, 3),
                                                (1.0, "cpu", False, 2))]
    if args.only:
        unknown = sorted(set(args.only) - {name_of(c) for c in grid})
        if unknown:
            raise SystemExit(f"--only: no configuration named {', '.join(unknown)}; the grid has "
                             f"{', '.join(name_of(c) for c in grid)}")
        grid = [c for c in grid if name_of(c) in args.only]
    start = time.perf_counter()
    results = []
    with open(Path(args.out) / "results.jsonl", "w") as fh:
        for c in grid:
            left = args.budget_s - (time.perf_counter() - start)
            if left < 30:
                print(f"budget spent: {name_of(c)} and later ones not run", flush=True)
                break
            r = launch(c, args, timeout=left)
            results.append(r)
            fh.write(json.dumps(r) + "\n")
            fh.flush()
            print(describe(r), flush=True)
    ok = [r for r in results if r["status"] == "ok"]
    lines = [describe(r) for r in results]
    if ok:
        best = max(ok, key=lambda r: r["fwd_bwd_mfu"])
        best_step = max(ok, key=lambda r: r["step_mfu"])
        lines += ["", f"best forward+backward: {best['name']}: MFU {100 * best['fwd_bwd_mfu']:.1f}% "
                      f"({best['fwd_bwd_tokens_per_s']:.0f} tokens/s, {best['params'] / 1e9:.2f}B parameters, "
                      f"attention {best['attn']})",
                  f"best whole step:       {best_step['name']}: MFU {100 * best_step['step_mfu']:.1f}% "
                  f"({best_step['step_tokens_per_s']:.0f} tokens/s)"]
        if args.profile:
            c = {k: best[k] for k in ("micro_batch", "checkpoint_layers", "offload", "persist", "stage")}
            p = launch(c, args, timeout=max(120.0, args.budget_s / 4), profile_run=True)
            lines.append(f"profile: {p.get('profile', p['status'] + ' ' + p.get('error', '')[:300])}")
    else:
        lines.append("no configuration finished")
    summary = "\n".join(lines)
    (Path(args.out) / "summary.txt").write_text(summary + "\n")
    print("\n" + summary)


if __name__ == "__main__":
    main()
