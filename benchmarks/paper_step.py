"""The paper's training step on the GPUs of one host, measured as a user runs it: where a step's time goes, the
training phase's MFU, what its checkpoints cost, and how long a resume on another number of ranks takes before
its next step starts. Writes ``paper_step.json`` and ``paper_step.md`` under ``--out``.

    python benchmarks/paper_step.py --out DIR --gpus 4 --resume-gpus 2            # kevin_7b, random weights
    python benchmarks/paper_step.py --out DIR --experiment kevin_14b --gpus 8 --think-tokens 6000
    python benchmarks/paper_step.py --out DIR --gpus 4 -- trainer.offload_optimizer=cpu   # a layout by hand
    python benchmarks/paper_step.py --out DIR --smoke                             # the tiny model on CPU ranks

1. ``python -m kevin_exp.train experiment=<--experiment>`` with ``model.source=random`` (the shape, no download),
   the built-in tasks, scripted answers that open with ``--think-tokens`` of reasoning-like prose (responses of
   the paper's length), ``--tasks`` x ``--trajectories`` x ``--turns``, one rank per GPU, ``--steps`` steps, a
   checkpoint after each (the layout is the run's own ``auto`` unless overrides after ``--`` set it). From
   ``metrics.jsonl``: each step's split (generate, evaluate, wait on verdicts, train, checkpoint), tokens trained
   per second, the run's ``mfu`` and peak GPU memory, and the checkpoint's share of the step.
2. The same run resumed on ``--resume-gpus`` ranks for one more step (0: skipped): the seconds until the run says
   it resumes (the conversion to DeepSpeed's universal form included) and until its next step's first turn is
   generated, then the whole step.
3. An estimate of a step of ``--estimate-responses`` responses (the paper's 512) at the measured training
   throughput: the training phase's seconds, from the mean trained tokens per response.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from multi_gpu_run import child_env, print_tail, tokenizer_override  # noqa: E402

COLUMNS = ("step", "step_s", "generate_s", "evaluate_s", "evaluate_wait_s", "train_s", "checkpoint_s", "train_tokens",
           "train_tokens_per_s", "mfu", "gpu_mem_peak_gb", "world_size")
SMOKE = ["model=tiny", "tasks=builtin", "resources=cpu", "resources.gpus_per_node=0", "trainer.device=cpu",
         "trainer.bf16=false", "evaluator.backend=cpu", "evaluator.timed_trials=5", "evaluator.warmup_trials=1",
         "evaluator.correctness_trials=1"]


def train_command(args: argparse.Namespace, ranks: int, steps: int, run_dir: Path) -> list[str]:
    think = args.think_tokens
    common = [f"steps={steps}", f"tasks_per_step={args.tasks}", f"n_trajectories={args.trajectories}",
              f"n_turns={args.turns}", "rollout.backend=scripted", f"rollout.scripted_think_tokens={think}",
              f"rollout.max_new_tokens={think + 1024}", "trainer.checkpoint_every=1", "logger.progress=lines",
              f"hydra.run.dir={run_dir}"]
    if args.smoke:
        common += ["trainer=deepspeed", *SMOKE, f"resources.ranks_per_node={ranks}"]
    else:
        common += [f"experiment={args.experiment}", "model.source=random", "tasks=builtin",
                   f"resources.gpus_per_node={ranks}", "evaluator.backend=cuda"]
    return [sys.executable, "-m", "kevin_exp.train", *common, *tokenizer_override(), *args.overrides]


def run(cmd: list[str], log_path: Path, limit_s: float, smoke: bool, marks: dict[str, str]) -> dict[str, Any]:
    """Runs ``cmd``, its output to ``log_path``; the seconds at which each of ``marks`` (name -> regex) first
    matched a line."""
    env = child_env({"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""} if smoke else None)
    seen: dict[str, float] = {}
    t0 = time.monotonic()
    with open(log_path, "w") as log, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      text=True, cwd=REPO, start_new_session=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            for name, pattern in marks.items():
                if name not in seen and re.search(pattern, line):
                    seen[name] = round(time.monotonic() - t0, 1)
            if time.monotonic() - t0 > limit_s:
                proc.kill()
                break
    return {"exit": proc.returncode, "seconds": round(time.monotonic() - t0, 1), "marks": seen}


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    from kevin_exp.records.run_records import read_jsonl

    path = run_dir / "metrics.jsonl"
    return [{k: m.get(k) for k in COLUMNS} for m in read_jsonl(path)] if path.is_file() else []


def checkpoint_share(row: dict[str, Any]) -> float | None:
    """The checkpoint's share of the step it ends (the step's own time plus writing its checkpoint)."""
    if row.get("checkpoint_s") is None or not row.get("step_s"):
        return None
    return row["checkpoint_s"] / (row["step_s"] + row["checkpoint_s"])


def estimate(rows: list[dict[str, Any]], responses_per_step: int, responses: int) -> dict[str, Any] | None:
    """The training phase of a step of ``responses`` responses at the last step's tokens per second."""
    last = rows[-1] if rows else None
    if not last or not last.get("train_tokens") or not last.get("train_tokens_per_s"):
        return None
    per_response = last["train_tokens"] / responses_per_step
    return {"responses": responses, "trained_tokens": round(per_response * responses),
            "train_s": round(per_response * responses / last["train_tokens_per_s"], 1)}


def report(result: dict[str, Any]) -> str:
    lines = [f"# {result['experiment']} on {result['gpus']} rank(s), responses of ~{result['think_tokens']} tokens", "",
             f"`{result['command']}`", "",
             "| step | ranks | step s | generate s | evaluate s | waiting s | train s | checkpoint s | checkpoint share | "
             "tokens/s | MFU | peak GPU GB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["steps"]:
        share, mfu = checkpoint_share(r), r.get("mfu")
        lines.append(" | ".join(["", str(r["step"]), str(r["world_size"]), *(f"{r[k] or 0:.1f}" for k in (
            "step_s", "generate_s", "evaluate_s", "evaluate_wait_s", "train_s")),
            "-" if r["checkpoint_s"] is None else f"{r['checkpoint_s']:.1f}", "-" if share is None else f"{share:.1%}",
            f"{r['train_tokens_per_s'] or 0:.0f}", "-" if mfu is None else f"{mfu:.1%}",
            f"{r['gpu_mem_peak_gb'] or 0:.1f}", ""]).strip())
    resume = result.get("resume")
    if resume:
        lines += ["", f"Resume on {resume['gpus']} rank(s): exit {resume['exit']}; says it resumes after "
                  f"{resume['marks'].get('resumed', '-')} s, its next step's first turn generated after "
                  f"{resume['marks'].get('next_step', '-')} s, done after {resume['seconds']} s."]
    est = result.get("estimate")
    if est:
        lines += ["", f"A step of {est['responses']} responses ({est['trained_tokens']} tokens trained) at the last "
                  f"step's training throughput: training phase about {est['train_s']} s."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--experiment", default="kevin_7b")
    ap.add_argument("--gpus", type=int, default=4, help="ranks of the run, one per GPU")
    ap.add_argument("--resume-gpus", type=int, default=2, help="ranks of the resumed step (0: no resume)")
    ap.add_argument("--think-tokens", type=int, default=6000, help="reasoning prose opening each scripted answer")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--estimate-responses", type=int, default=512)
    ap.add_argument("--limit-s", type=float, default=3000.0, help="each run's time limit")
    ap.add_argument("--smoke", action="store_true", help="the tiny model on CPU ranks (checks this script)")
    ap.add_argument("overrides", nargs="*", help="more overrides for both runs (after --)")
    args = ap.parse_args()
    if args.smoke:
        args.think_tokens, args.tasks, args.trajectories, args.steps = 32, 2, 2, 2
        args.gpus, args.resume_gpus = 2, 1
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / "run"
    cmd = train_command(args, args.gpus, args.steps, run_dir)
    first = run(cmd, args.out / "run.log", args.limit_s, args.smoke, {})
    if first["exit"] != 0:
        print_tail(args.out / "run.log")
    result: dict[str, Any] = {"experiment": "smoke" if args.smoke else args.experiment, "gpus": args.gpus,
                              "think_tokens": args.think_tokens, "command": " ".join(cmd[1:]), "run": first}
    if args.resume_gpus and first["exit"] == 0:
        again = train_command(args, args.resume_gpus, args.steps + 1, run_dir)
        resumed = run(again, args.out / "resume.log", args.limit_s, args.smoke,
                      {"resumed": r"resuming .* from step_", "next_step": rf"step {args.steps + 1}/{args.steps + 1} turn 1"})
        if resumed["exit"] != 0:
            print_tail(args.out / "resume.log")
        result["resume"] = {"gpus": args.resume_gpus, "command": " ".join(again[1:]), **resumed}
    result["steps"] = step_rows(run_dir)
    responses = args.tasks * args.trajectories * args.turns
    result["estimate"] = estimate([r for r in result["steps"] if r["world_size"] == args.gpus], responses,
                                  args.estimate_responses)
    (args.out / "paper_step.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (args.out / "paper_step.md").write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
