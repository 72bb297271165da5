"""Kevin's multi-turn GRPO loop: rollout -> kernel evaluation -> per-turn credit -> policy update.

Where this loop departs from the paper (arXiv 2507.11948), and why:
- Defaults are smoke-scale (a 135M model, 2 tasks x 4 trajectories x 2 turns) so the main job runs on a
  laptop; the paper's values are `experiment=kevin_32b` (8 tasks x 16 trajectories x 4 turns).
- One process holds the policy for generation (Hugging Face generate) and training; Kevin ran vLLM engines
  offloaded to CPU between phases (App. C). The generation backend sits behind one interface.
- "2 gradient steps per batch" is read as the rollout batch split into 2 mini-batches (`trainer.minibatches`),
  the first on-policy and the second off-policy against the stored old log-probs.
- Constant loss normalisation divides by (sequences x max_new_tokens), as Dr. GRPO; the paper does not give
  the constant (section 6.1).
- Each step's tasks are a seeded sample of the pool (the paper does not state its batching order), so a
  resumed run draws the same tasks.
- The lr warm-up counts gradient steps (ratio 0.03 of all of them); the paper states the ratio only.
"""
from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kevin_exp.config import AlgorithmConfig, TrainConfig
from kevin_exp.metric_logger import build_metric_logger
from kevin_exp.progress import Progress
from kevin_exp.records import RunRecords, run_id_for
from kevin_exp.rl.credit import turn_credit
from kevin_exp.rollout.loop import RolloutSettings, TurnSample, run_rollout
from kevin_exp.tasks import Problem
from kevin_exp.trainer.checkpoint import Checkpointer
from kevin_exp.trainer.learner import Learner, LearnerSample
from kevin_exp.trainer.setup import build_environment, load_task_pool, resolve_device
from kevin_exp.trainer.signals import signals_held

log = logging.getLogger(__name__)


class RunDirInUse(RuntimeError):
    pass


def pick_tasks(pool: list[Problem], k: int, seed: int, step: int) -> list[Problem]:
    rng = random.Random(f"{seed}/{step}")
    return rng.sample(pool, min(k, len(pool)))


def assign_credit(samples: list[TurnSample], algo: AlgorithmConfig) -> None:
    """Each sample's discounted return and group-normalised advantage (Kevin's per-turn credit)."""
    returns, advantages = turn_credit(
        [s.result.score for s in samples], [s.task.problem_id for s in samples], [s.trajectory for s in samples],
        [s.turn for s in samples], algo.gamma, algo.aggregation, algo.estimator, algo.scale_by_std,
    )
    for s, r, a in zip(samples, returns, advantages):
        s.ret, s.advantage = r, a


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 65_537) % (2**31 - 1)


def is_not_okay(text: str, opening: str) -> bool:
    """Kevin's instability proxy: the reasoning does not open with the model's usual opening."""
    body = text.lstrip()
    if body.lower().startswith("<think>"):
        body = body[len("<think>") :].lstrip()
    return not body.startswith(opening)


class TrainingRun:
    def __init__(self, cfg: TrainConfig, config_yaml: str = "", resolved: dict[str, Any] | None = None,
                 sweep: str | None = None) -> None:
        self.cfg = cfg
        self.sweep = sweep or cfg.sweep_name
        self.run_dir = Path(cfg.run_dir).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_id = run_id_for(self.run_dir)
        self.records = RunRecords(self.run_dir)
        self.checkpointer = Checkpointer(self.run_dir, cfg.trainer.keep_checkpoints)
        self._config_yaml, self._resolved = config_yaml, resolved or asdict(cfg)

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        from kevin_exp.models import chat_prompt_ids, load_policy
        from kevin_exp.rollout.generation import HFGenerator

        cfg = self.cfg
        if cfg.resume not in ("auto", "never"):
            raise ValueError(f"resume={cfg.resume!r}: expected auto or never")
        latest = self.checkpointer.latest() if cfg.resume == "auto" else None
        if cfg.resume == "never" and (self.records.has_rows() or self.checkpointer.latest() is not None):
            raise RunDirInUse(f"{self.run_dir} already holds records; use resume=auto to continue it, or a new run_dir")
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % (2**32))
        torch.manual_seed(cfg.seed)
        self.pool = load_task_pool(cfg.tasks)
        self.device = resolve_device(cfg.trainer.device)
        self.policy = load_policy(cfg.model, self.device)
        tok = self.policy.tokenizer
        self.encode_prompt = lambda text: chat_prompt_ids(tok, text, cfg.model.system_prompt)
        self.count_tokens = lambda text: len(tok.encode(text, add_special_tokens=False))
        self.env = build_environment(cfg, vocab_size=len(tok))
        self.generator = HFGenerator(self.policy, cfg.rollout.generation_batch_size)
        self.learner = Learner(self.policy.model, tok.pad_token_id, cfg.trainer, cfg.algorithm, cfg.rollout.max_new_tokens,
                               cfg.steps, self.device)
        self.start_step = 0
        if latest is not None:
            state = self.checkpointer.load(latest, self.policy.model, self.learner.optimizer, self.learner.scheduler)
            self.start_step = state["step"] + 1
            log.info("resuming %s from %s (step %d done)", self.run_dir, latest.name, state["step"] + 1)
        self.drop_unfinished_rows()
        self.records.write_provenance(self._resolved, self._config_yaml, self.start_step)
        self.records.open()
        self.metric_logger = build_metric_logger(cfg.logger, self.run_dir, self.run_id, experiment=cfg.experiment,
                                                 sweep=self.sweep, config=self._resolved)

    def drop_unfinished_rows(self) -> None:
        dropped = self.records.resume_at(self.start_step - 1)
        if dropped:
            log.info("dropped %d rows written after the last checkpoint; their steps run again", dropped)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        groups = 2 if cfg.rollout.overlap and cfg.tasks_per_step >= 2 else 1
        progress = Progress(cfg.logger.progress, cfg.steps, self.start_step, cfg.n_turns * groups)
        history = []
        try:
            for step in range(self.start_step, cfg.steps):
                metrics = self.train_step(step, progress)
                history.append(metrics)
                progress.step(metrics)
                self.metric_logger.log(metrics)
                if (step + 1) % cfg.trainer.checkpoint_every == 0 or step + 1 == cfg.steps:
                    with signals_held():
                        self.checkpointer.save(step, self.policy.model, self.learner.optimizer, self.learner.scheduler,
                                               {"run_id": self.run_id})
        finally:
            progress.close()
            self.metric_logger.close()
            self.records.close()
            self.env.close()
        return history

    def train_step(self, step: int, progress: Progress) -> dict[str, Any]:
        cfg = self.cfg
        t_step = time.perf_counter()
        tasks = pick_tasks(self.pool, cfg.tasks_per_step, cfg.seed, step)
        settings = RolloutSettings(cfg.n_trajectories, cfg.n_turns, cfg.rollout.max_new_tokens, cfg.rollout.max_prompt_tokens,
                                   cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.overlap)
        samples, times = run_rollout(tasks, self.generator, self.env, self.encode_prompt, self.count_tokens, settings,
                                     seed=step_seed(cfg.seed, step),
                                     on_turn=lambda turn, group, s: progress.turn(step, turn, group, s))
        assign_credit(samples, cfg.algorithm)
        self.records.append_turns([self.turn_row(step, s) for s in samples])
        t_train = time.perf_counter()
        stats = self.learner.update([LearnerSample(s.prompt_ids, s.response_ids, s.advantage) for s in samples],
                                    seed=step_seed(cfg.seed, step))
        train_s = time.perf_counter() - t_train
        metrics = self.metrics_row(step, samples, stats, times, train_s, time.perf_counter() - t_step)
        self.records.append_metrics(metrics)
        return metrics

    # ------------------------------------------------------------------ records
    def turn_row(self, step: int, s: TurnSample) -> dict[str, Any]:
        cfg, r = self.cfg, s.result
        return {
            "run_id": self.run_id, "split": "train", "step": step, "task_id": s.task.problem_id, "level": s.task.level,
            "trajectory": s.trajectory, "turn": s.turn + 1, "status": r.status, "correct": r.correct,
            "speedup": r.speedup if r.correct else None, "runtime_ms": r.runtime_ms, "ref_runtime_ms": r.ref_runtime_ms,
            "score": r.score, "return": s.ret, "advantage": s.advantage, "response_tokens": len(s.response_ids),
            "prompt_tokens": len(s.prompt_ids), "dropped_attempts": s.dropped_attempts, "truncated": s.truncated,
            "not_okay": is_not_okay(s.text, cfg.model.usual_opening), "excessive_speedup": r.excessive_speedup,
            "reason": r.reason[:300], "device": r.device, "backend": self.env.backend, "gamma": cfg.gamma,
            "n_turns": cfg.n_turns, "n_trajectories": cfg.n_trajectories, "tasks_per_step": cfg.tasks_per_step,
            "normalization": cfg.normalization, "aggregation": cfg.algorithm.aggregation,
            "estimator": cfg.algorithm.estimator, "model": cfg.model.name, "seed": cfg.seed,
            "experiment": cfg.experiment, "sweep_name": cfg.sweep_name,
        }

    def metrics_row(self, step: int, samples: list[TurnSample], stats, times, train_s: float, step_s: float) -> dict[str, Any]:
        cfg = self.cfg
        scores = [s.result.score for s in samples]
        per_turn = []
        for k in range(cfg.n_turns):
            turn = [s for s in samples if s.turn == k]
            per_turn.append(sum(s.result.correct for s in turn) / max(1, len(turn)))
        speedups = [s.result.speedup for s in samples if s.result.correct and s.result.speedup is not None]
        row: dict[str, Any] = {
            "run_id": self.run_id, "step": step, "samples": len(samples),
            "reward_mean": float(np.mean(scores)) if scores else 0.0, "reward_max": max(scores, default=0.0),
            "correct_ratio": sum(s.result.correct for s in samples) / max(1, len(samples)),
            "correct_per_turn": per_turn,
            "speedup_mean": float(np.mean(speedups)) if speedups else None,
            "status_counts": dict(Counter(s.result.status for s in samples)),
            "response_tokens_mean": float(np.mean([len(s.response_ids) for s in samples])) if samples else 0.0,
            "truncation_ratio": sum(s.truncated for s in samples) / max(1, len(samples)),
            "not_okay_ratio": sum(is_not_okay(s.text, cfg.model.usual_opening) for s in samples) / max(1, len(samples)),
            "loss": stats.loss, "grad_norm": stats.grad_norm, "kl": stats.kl, "entropy": stats.entropy,
            "clip_fraction": stats.clip_fraction, "lr": stats.lr, "gradient_steps": stats.gradient_steps,
            "generate_s": times.generate_s, "evaluate_s": times.evaluate_s, "evaluate_wait_s": times.evaluate_wait_s,
            "train_s": train_s, "step_s": step_s,
            "gamma": cfg.gamma, "n_turns": cfg.n_turns, "n_trajectories": cfg.n_trajectories,
            "normalization": cfg.normalization, "model": cfg.model.name, "seed": cfg.seed,
        }
        for k, v in enumerate(per_turn):
            row[f"correct_turn_{k + 1}"] = v
        return row
