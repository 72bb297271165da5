"""Kevin's multi-turn GRPO loop: rollout -> kernel evaluation -> per-turn credit -> policy update.

Where this loop departs from the paper (arXiv 2507.11948), and why:
- Defaults are smoke-scale (a 135M model, 2 tasks x 4 trajectories x 2 turns) so the main job runs on a
  laptop; the paper's values are `experiment=kevin_32b` (8 tasks x 16 trajectories x 4 turns).
- One process holds the policy for generation (Hugging Face generate) and training; Kevin ran vLLM engines
  offloaded to CPU between phases (App. C). Generation and training sit behind one interface each
  (``rollout.generation.Generator``, ``trainer.learner.Learner``), chosen by rollout.backend and trainer.backend.
- "2 gradient steps per batch" is read as the rollout batch split into 2 mini-batches (`trainer.minibatches`),
  the first on-policy and the second off-policy against the stored old log-probs.
- Constant loss normalisation divides by (sequences x max_new_tokens), as Dr. GRPO; the paper does not give
  the constant (section 6.1).
- Each step's tasks are a seeded sample of the pool (the paper does not state its batching order), so a
  resumed run draws the same tasks.
- The lr warm-up counts gradient steps (ratio 0.03 of all of them); the paper states the ratio only.

A run of N ranks (``trainer=deepspeed``, one process per GPU, docs/deepspeed.md) splits each step's tasks into N
contiguous shares; every rank rolls out, evaluates (on its own GPU) and credits its share (a task's whole group
sits on one rank, so group advantages need no communication), then all ranks train together. Rank 0 gathers
the samples and writes every row once, in rank order (for one rank: the order of a single process), and the
step's metrics, reduced over ranks.
"""
from __future__ import annotations

import copy
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kevin_exp.config import TrainConfig, world_size_problems
from kevin_exp.errors import UserError
from kevin_exp.launch.layout import resolve_layout
from kevin_exp.launch.resources import uses_gpu
from kevin_exp.launch.world import context_from_env
from kevin_exp.models.loading import Policy
from kevin_exp.records.progress import Progress
from kevin_exp.records.rows import metrics_row, scale_columns, training_settings, turn_row
from kevin_exp.records.run_records import json_safe
from kevin_exp.records.transcripts import transcript_rows
from kevin_exp.rollout.generators import build_generator
from kevin_exp.rollout.loop import RolloutTimes, TurnSample, run_rollout
from kevin_exp.run.folder import RunFolder
from kevin_exp.run.parts import build_logger, build_policy_parts
from kevin_exp.run.signals import raise_if_stopping, signals_held
from kevin_exp.run.step import assign_credit, pick_tasks, rank_share, rollout_settings, step_seed
from kevin_exp.run.throughput import device_peak_flops, gpu_peak_gb, host_rss_peak_gb, mfu, reset_gpu_peak
from kevin_exp.trainer import collectives
from kevin_exp.trainer.checkpoint import Checkpointer, saved_world_size
from kevin_exp.trainer.learner import LearnerSample, TrainBatch
from kevin_exp.trainer.learners import build_learner

log = logging.getLogger(__name__)


class RunDirInUse(UserError):
    pass


@dataclass
class StepRollout:
    samples: list[TurnSample]
    times: RolloutTimes
    staleness: int  # 1: sampled with the weights from before the previous step's update
    done_at: float


class AheadRollout:
    """The next step's rollout on a thread of its own while this step trains (``rollout.async_steps=1``)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kx-ahead")
        self._next: Future | None = None

    def start(self, rollout: Callable[[], StepRollout]) -> None:
        self._next = self._pool.submit(rollout)

    def take(self) -> StepRollout | None:
        """The rollout started for this step (waiting for it), or None when none was started (the first step)."""
        if self._next is None:
            return None
        try:
            return self._next.result()
        finally:
            self._next = None

    def drop(self) -> None:
        """A run ending early leaves an unfinished rollout unread: it was never recorded, and a resumed run samples
        that step again."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class TrainingRun:
    """Steps are numbered from 1: step k's rows carry ``step=k`` and its checkpoint is ``step_00000k``."""

    def __init__(self, cfg: TrainConfig, sweep: str | None = None) -> None:
        if cfg.run_dir is None:
            raise ValueError("TrainingRun needs cfg.run_dir (the entry point fills it from Hydra's job folder)")
        # the entry point resolved the layout already (and printed it); a run built from a composed config here
        cfg = resolve_layout(cfg, on_gpu=uses_gpu(cfg))[0]
        self.cfg = cfg
        self.sweep = sweep or cfg.sweep_name
        self.folder = RunFolder.at(cfg.run_dir)
        self.run_dir, self.run_id, self.records = self.folder.path, self.folder.run_id, self.folder.records
        self.checkpointer = Checkpointer(self.run_dir, cfg.trainer.keep_checkpoints, cfg.trainer.keep_every)
        self.settings = training_settings(cfg)
        self.ctx = context_from_env()
        problems = world_size_problems(cfg, self.ctx.world_size)
        if problems:
            raise UserError("; ".join(problems))

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg = self.cfg
        latest = self.checkpointer.latest() if cfg.resume == "auto" else None
        if cfg.resume == "never" and (self.records.has_rows() or self.checkpointer.latest() is not None):
            raise RunDirInUse(f"resume=never: {self.run_dir} already holds records; use resume=auto to continue it, "
                              "or give the run another folder (run_dir=...)")
        self.parts = build_policy_parts(cfg)
        self.policy, self.env, self.generator = self.parts.policy, self.parts.env, self.parts.generator
        self.pool, self.device = self.parts.pool, self.parts.device
        sharded = cfg.trainer.backend == "deepspeed"
        universal = sharded and latest is not None and saved_world_size(latest) not in (None, self.ctx.world_size)
        self.learner = build_learner(cfg, self.policy.model, self.policy.tokenizer.pad_token_id, self.parts.device,
                                     load_universal=universal)
        self.generation_model = None
        if cfg.rollout.async_steps and cfg.rollout.backend == "hf":
            # the next step samples while the learner updates its weights: generation needs a copy of its own
            self.generation_model = copy.deepcopy(self.policy.model).requires_grad_(False).eval()
            self.generator = build_generator(cfg, Policy(self.generation_model, self.policy.tokenizer, self.policy.name),
                                             self.pool, self.env.backend, cfg.n_trajectories, self.device)
        self.n_params = self.learner.parameter_count()
        self.peak_flops = device_peak_flops(self.device)
        self.start_step = 1
        kept_row = None
        if latest is not None:
            if sharded:
                state = self.checkpointer.load_sharded(latest, self.learner)
            else:
                state = self.checkpointer.load(latest, self.learner.model, self.learner.optimizer, self.learner.scheduler)
            self.start_step = state["step"] + 1
            kept_row = state.get("row")
            log.info("resuming %s from %s (%d steps done)", self.run_dir, latest.name, state["step"])
        if self.ctx.is_main:
            dropped = self.records.resume_at(self.start_step - 1)
            if dropped:
                log.info("dropped %d rows written after the last checkpoint; their steps run again", dropped)
            self.folder.transcripts.resume_at(self.start_step - 1)
            self.folder.open(cfg, self.start_step)
            if kept_row and self.records.restore_metrics(kept_row):
                log.info("step %d's metrics row restored from its checkpoint (the run stopped before appending it)",
                         kept_row["step"])
            self.metric_logger = build_logger(cfg, self.folder, self.sweep)
        collectives.barrier()

    def checkpoint(self, step: int, row: dict[str, Any]) -> float | None:
        """Step ``step``'s checkpoint, where one is due (every ``trainer.checkpoint_every`` steps and after the last),
        with the optimizer's states where ``trainer.state_every`` says so; its seconds (max over ranks; None when
        none was due). The checkpoint keeps the step's metrics row: a run stopped after the checkpoint is in place
        and before the row is appended gets the row back when it resumes."""
        trainer, last = self.cfg.trainer, step == self.cfg.steps
        if step % trainer.checkpoint_every and not last:
            return None
        full_state = step % trainer.state_every == 0 or last
        t0 = time.perf_counter()
        extra = {"run_id": self.run_id, "row": {**row, "checkpoint_s": None} if row else None}
        with signals_held():
            if trainer.backend == "deepspeed":
                self.checkpointer.save_sharded(step, self.learner, extra, full_state)
            elif self.ctx.is_main:
                self.checkpointer.save(step, self.learner.model, self.learner.optimizer, self.learner.scheduler, extra,
                                       full_state)
        return round(collectives.reduce_values([time.perf_counter() - t0], "max")[0], 4)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        groups = 2 if cfg.rollout.schedule == "halves" and cfg.tasks_per_step >= 2 else 1
        progress = Progress(cfg.logger.progress if self.ctx.is_main else "none", cfg.steps, self.start_step - 1, cfg.n_turns * groups)
        history = []
        main = self.ctx.is_main
        ahead = AheadRollout() if cfg.rollout.async_steps else None
        try:
            for step in range(self.start_step, cfg.steps + 1):
                t_step = time.perf_counter()
                reset_gpu_peak(self.device)
                rollout = ahead.take() if ahead is not None else None
                self.sync_generator()  # the learner's current weights (the previous step's update)
                if rollout is None:
                    rollout = self.rollout(step, progress, staleness=0)
                if ahead is not None and step < cfg.steps:
                    # the next step samples with these weights while this step's update is computed
                    ahead.start(lambda following=step + 1: self.rollout(following, progress, staleness=1))
                metrics = self.train_step(step, rollout, t_step)
                history.append(metrics)
                if main:
                    progress.step(metrics)
                    self.metric_logger.log(metrics)
        finally:
            if ahead is not None:
                ahead.drop()
            progress.close()
            if main:
                self.metric_logger.close()
                self.folder.close()
            self.env.close()
            self.generator.close()
        return history

    def sync_generator(self) -> None:
        """Give the generator the learner's current weights where it holds its own."""
        if self.generator.owns_weights:
            # the engine slept through training: weights back, the learner's current ones pushed (collective
            # under ZeRO-3, one parameter at a time)
            self.generator.wake()
            self.generator.update_weights(self.learner.generator_weights())
        elif self.generation_model is not None:
            self.generation_model.load_state_dict(self.learner.model.state_dict())

    def rollout(self, step: int, progress: Progress, staleness: int) -> "StepRollout":
        """Step ``step``'s rollouts with the generator's current weights, credited (no collective, no record)."""
        cfg, parts, ctx = self.cfg, self.parts, self.ctx
        tasks = rank_share(pick_tasks(parts.pool, cfg.tasks_per_step, cfg.seed, step), ctx.rank, ctx.world_size)
        samples, times = run_rollout(tasks, self.generator, self.env, parts.encode_prompt, parts.count_tokens,
                                     rollout_settings(cfg, cfg.n_trajectories, cfg.n_turns, cfg.rollout.schedule),
                                     seed=step_seed(cfg.seed, step) + ctx.rank,
                                     on_turn=lambda turn, group, s: progress.turn(step, turn, group, s) if ctx.is_main else None,
                                     # within a turn: rank 0's share (the other ranks show nothing)
                                     on_progress=(lambda counts: progress.within(step, counts))
                                     if ctx.is_main and progress.mode != "none" else None)
        assign_credit(samples, cfg)
        return StepRollout(samples, times, staleness, time.perf_counter())

    def train_step(self, step: int, rollout: "StepRollout", t_step: float) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        samples, times = rollout.samples, rollout.times
        t_gather = time.perf_counter()
        every = collectives.gather_to_main(samples)  # where a rank that finished its rollout first waits
        barrier_s = time.perf_counter() - t_gather
        all_samples = [s for share in every for s in share] if every is not None else []
        raise_if_stopping()  # verdicts given after a Ctrl-C are the stopped evaluator's, never recorded
        if ctx.is_main:
            self.records.append_turns([turn_row(self.run_id, "train", step, s, self.settings, cfg.model.usual_opening,
                                                self.env.backend) for s in all_samples])
            self.folder.transcripts.append(step, transcript_rows("train", step, all_samples))
        t_train = time.perf_counter()
        self.generator.sleep()
        stats = self.learner.train_step(TrainBatch(
            [LearnerSample(s.prompt_ids, s.response_ids, s.advantage, s.logprobs) for s in samples],
            seed=step_seed(cfg.seed, step)))
        train_s = time.perf_counter() - t_train
        engine_stats = self.generator.pop_stats()
        engine_values = collectives.reduce_values(list(engine_stats.values()), "max") if engine_stats else []
        trained = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples
                      if s.response_ids and (s.advantage != 0.0 or cfg.algorithm.kl_coef > 0)) * cfg.trainer.epochs
        trained_tokens = collectives.reduce_values([trained], "sum")[0]
        step_s = collectives.reduce_values([time.perf_counter() - t_step], "max")[0]
        # each rank's own split of the step; the step's columns are the max over ranks, which hides who waited
        ranks = collectives.gather_to_main(rank_times(ctx.rank, times, barrier_s, train_s, self.device))
        metrics: dict[str, Any] = {}
        if ctx.is_main:
            gen_s, eval_s, wait_s, train_s, gpu_gb, rss_gb = (
                max(r[k] for r in ranks) for k in ("generate_s", "evaluate_s", "evaluate_wait_s", "train_s",
                                                    "gpu_mem_peak_gb", "host_rss_peak_gb"))
            metrics = metrics_row(self.run_id, step, all_samples, stats, RolloutTimes(gen_s, eval_s, wait_s), train_s,
                                  step_s, self.settings, cfg.model.usual_opening)
            metrics.update(scale_columns(ctx.world_size, trained_tokens, train_s, gpu_gb, rss_gb,
                                         mfu(self.n_params, trained_tokens, train_s, self.peak_flops, ctx.world_size)))
            # the generator engine's transitions: seconds and GPU memory in use after each (max over ranks)
            metrics.update({k: round(v, 4) for k, v in zip(engine_stats, engine_values)})
            # policy versions between the weights the step's responses were sampled with and those it trained
            metrics["policy_staleness"] = rollout.staleness
            metrics["ranks"] = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in ranks]
        # before the row is appended, so the row says what its checkpoint cost (the checkpoint keeps the row)
        checkpoint_s = self.checkpoint(step, json_safe(metrics))
        if ctx.is_main:
            metrics["checkpoint_s"] = checkpoint_s
            self.records.append_metrics(metrics)
        return collectives.broadcast_object(metrics)


def rank_times(rank: int, times: RolloutTimes, barrier_s: float, train_s: float, device: torch.device) -> dict[str, Any]:
    """One rank's split of a step: rolling out (generating, evaluating, waiting on verdicts with nothing to
    generate), waiting at the step's barrier for the other ranks' rollouts, training; and its own memory peaks."""
    return {"rank": rank, "generate_s": times.generate_s, "evaluate_s": times.evaluate_s,
            "evaluate_wait_s": times.evaluate_wait_s, "barrier_s": barrier_s, "train_s": train_s,
            "gpu_mem_peak_gb": gpu_peak_gb(device), "host_rss_peak_gb": host_rss_peak_gb()}
