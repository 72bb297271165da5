"""Evaluation of a policy on held-out tasks, no training: every task gets ``eval.n_trajectories`` parallel
trajectories of ``eval.n_turns`` refinement turns, scored by the same evaluator as training, written as the
same per-turn rows with ``split=eval`` (Kevin section 5: 16 x 8 on the held-out tasks).

The policy is a training run's checkpoint (its model, tokenizer and training settings come from the run's
recorded config; a different model given on the command line is an error) or, without one, the model's own
weights. Rows carry the policy's training settings in the usual columns (gamma, n_turns, n_trajectories, ...)
and the evaluation's budget in ``eval_n_trajectories`` / ``eval_n_turns``; ``step`` is the number of training
steps behind the weights (0: untrained).

Rows are appended per batch of tasks; a restarted evaluation keeps every batch it finished, drops the rows of a
batch it had not finished, and goes on.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from kevin_exp.config import TrainConfig, config_from_dict
from kevin_exp.errors import UserError
from kevin_exp.records.progress import Progress
from kevin_exp.records.rows import training_settings, turn_row
from kevin_exp.records.run_records import read_jsonl
from kevin_exp.records.transcripts import transcript_rows
from kevin_exp.rollout.loop import run_rollout
from kevin_exp.run.folder import RunFolder
from kevin_exp.run.parts import build_logger, build_policy_parts
from kevin_exp.run.signals import raise_if_stopping
from kevin_exp.run.step import assign_credit, rollout_settings, step_seed
from kevin_exp.tasks import Problem
from kevin_exp.trainer.checkpoint import checkpoint_step, find_checkpoint, load_policy_weights

log = logging.getLogger(__name__)


class CheckpointError(UserError):
    pass


def trained_config(checkpoint: Path) -> TrainConfig | None:
    """The settings the checkpoint's run trained with (its config.json), or None for a folder without one."""
    path = checkpoint.parents[1] / "config.json"
    if not path.is_file():
        return None
    try:
        return config_from_dict(TrainConfig, json.loads(path.read_text()))
    except (TypeError, ValueError) as e:  # a config.json of another version of this schema
        raise CheckpointError(f"checkpoint={checkpoint}: its run's config.json does not fit this version's settings "
                              f"({str(e).splitlines()[0]}); evaluate it with the version that trained it") from None


class EvaluationRun:
    def __init__(self, cfg: TrainConfig, sweep: str | None = None, model_chosen: bool = False) -> None:
        if cfg.run_dir is None:
            raise ValueError("EvaluationRun needs cfg.run_dir (the entry point fills it from Hydra's job folder)")
        self.checkpoint = find_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
        trained = trained_config(self.checkpoint) if self.checkpoint else None
        if trained is not None:
            if model_chosen and cfg.model != trained.model:
                raise CheckpointError(
                    f"checkpoint={cfg.checkpoint} was trained with model={trained.model.name}, not model={cfg.model.name}: "
                    "leave model out (the checkpoint's own model is used) or give the one it was trained with")
            cfg = dataclasses.replace(cfg, model=trained.model)
        self.cfg, self.sweep = cfg, sweep or cfg.sweep_name
        self.settings = {**training_settings(trained or cfg), "eval_n_trajectories": cfg.eval.n_trajectories,
                         "eval_n_turns": cfg.eval.n_turns, "checkpoint": str(self.checkpoint) if self.checkpoint else None}
        self.folder = RunFolder.at(cfg.run_dir)
        self.run_dir, self.run_id, self.records = self.folder.path, self.folder.run_id, self.folder.records

    def setup(self) -> None:
        cfg = self.cfg
        self.parts = build_policy_parts(cfg, evaluation=True)
        self.policy, self.env, self.generator = self.parts.policy, self.parts.env, self.parts.generator
        self.pool: list[Problem] = self.parts.pool
        self.policy_step = 0
        if self.checkpoint is not None:
            load_policy_weights(self.checkpoint, self.policy.model, cfg.model.name)
            self.policy_step = checkpoint_step(self.checkpoint)
        self.done_tasks = self.drop_unfinished_batches()
        self.folder.open(cfg, 0)
        self.metric_logger = build_logger(cfg, self.folder, self.sweep)

    def batches(self) -> list[list[Problem]]:
        """Fixed batches of the task list, so a resumed evaluation samples exactly as an uninterrupted one."""
        n = self.cfg.eval.tasks_per_batch
        return [self.pool[i:i + n] for i in range(0, len(self.pool), n)]

    def drop_unfinished_batches(self) -> set[str]:
        """Batches whose every task has all its rows stay; other rows and transcripts are dropped (their
        batch runs again). Returns the finished tasks."""
        path = self.records.turns_path
        rows = read_jsonl(path)
        per_task: dict[str, int] = {}
        for r in rows:
            per_task[r["task_id"]] = per_task.get(r["task_id"], 0) + 1
        full = self.cfg.eval.n_trajectories * self.cfg.eval.n_turns
        done: set[str] = set()
        for number, batch in enumerate(self.batches(), start=1):
            if all(per_task.get(t.problem_id) == full for t in batch):
                done |= {t.problem_id for t in batch}
            else:
                self.folder.transcripts.discard(number)
        kept = [r for r in rows if r["task_id"] in done]
        if len(kept) != len(rows):
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            log.info("dropped %d rows of unfinished batches; they run again", len(rows) - len(kept))
        return done

    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        todo = [(n, b) for n, b in enumerate(self.batches(), start=1) if any(t.problem_id not in self.done_tasks for t in b)]
        progress = Progress(cfg.logger.progress, len(todo), 0, cfg.eval.n_turns, unit="batch")
        settings = rollout_settings(cfg, cfg.eval.n_trajectories, cfg.eval.n_turns, cfg.rollout.schedule)
        summaries = []
        try:
            for k, (number, batch) in enumerate(todo, start=1):
                # the seed depends on the batch's tasks, not on how many batches ran before it
                seed = step_seed(cfg.seed, sum(self.pool.index(t) for t in batch))
                samples, times = run_rollout(batch, self.generator, self.env, self.parts.encode_prompt,
                                             self.parts.count_tokens, settings, seed=seed,
                                             on_turn=lambda turn, group, s: progress.turn(k, turn, 0, s),
                                             on_progress=(lambda counts: progress.within(k, counts))
                                             if progress.mode != "none" else None)
                assign_credit(samples, cfg)
                raise_if_stopping()  # verdicts given after a Ctrl-C are the stopped evaluator's, never recorded
                self.records.append_turns([turn_row(self.run_id, "eval", self.policy_step, s, self.settings,
                                                    cfg.model.usual_opening, self.env.backend) for s in samples])
                self.folder.transcripts.append(number, transcript_rows("eval", number, samples))
                correct = sum(s.result.correct for s in samples) / max(1, len(samples))
                summaries.append({"batch": number, "tasks": [t.problem_id for t in batch], "correct_ratio": correct,
                                  "generate_s": times.generate_s, "evaluate_s": times.evaluate_s})
                log.info("evaluated %s: %.0f%% of kernels correct", ", ".join(t.problem_id for t in batch), 100 * correct)
                progress.done(k)
        finally:
            progress.close()
            self.metric_logger.close()
            self.folder.close()
            self.env.close()
        return summaries


def eval_summary_lines(run_dir: Path) -> list[str]:
    """Kevin's headline numbers for this evaluation (analysis/ablation_table.py gives the full tables)."""
    # lazy: pandas and the analysis library serve only this closing summary, not the evaluation's start
    import pandas as pd

    from kevin_exp.analysis import task_scores, trajectory_scores

    rows = pd.DataFrame([r for r in read_jsonl(run_dir / "turns.jsonl") if r.get("split") == "eval"])
    if rows.empty:
        return [f"records: {run_dir}", "no task has been evaluated yet"]
    trajectories = trajectory_scores(rows.assign(block=rows["step"]))
    k = int(trajectories.groupby("task_id").size().max())
    corr, perf = task_scores(trajectories, "correct"), task_scores(trajectories, "perf")
    return [f"records: {run_dir}",
            f"  turns.jsonl   {len(rows)} rows (split=eval), {rows['task_id'].nunique()} tasks x {k} trajectories",
            f"correctness best@{k} {corr['best'].mean():.1%}, avg@{k} {corr['avg'].mean():.1%}; "
            f"mean speedup best@{k} {perf['best'].mean():.2f}x, avg@{k} {perf['avg'].mean():.2f}x",
            f"transcripts: python -m kevin_exp.show {run_dir} --split eval --list",
            f"tables and plots: python analysis/ablation_table.py {run_dir}"]
