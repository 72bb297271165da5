"""Evaluation of a policy on held-out tasks, no training: every task gets ``eval.n_trajectories`` parallel
trajectories of ``eval.n_turns`` refinement turns, scored by the same evaluator as training, written as the
same per-turn rows with ``split=eval`` (Kevin section 5: 16 x 8 on the held-out tasks).

Rows are appended per batch of tasks; a restarted evaluation keeps every task it finished, drops the rows of
a task it had not finished, and goes on.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from kevin_exp.config import TrainConfig
from kevin_exp.progress import Progress
from kevin_exp.records import read_jsonl
from kevin_exp.rollout.loop import RolloutSettings, run_rollout
from kevin_exp.trainer.loop import TrainingRun, assign_credit, step_seed

log = logging.getLogger(__name__)


def eval_summary_lines(run_dir: Path) -> list[str]:
    """Kevin's headline numbers for this evaluation (analysis/ablation_table.py gives the full tables)."""
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
            "tables and plots: python analysis/ablation_table.py <this dir>"]


class CheckpointError(ValueError):
    pass


def find_checkpoint(path: str) -> Path:
    """A run directory (its latest checkpoint) or one checkpoint folder (checkpoints/step_NNNNNN)."""
    p = Path(path).expanduser()
    pointer = p / "checkpoints" / "latest"
    if pointer.is_file():
        p = p / "checkpoints" / pointer.read_text().strip()
    if not (p / "policy.pt").is_file() or not (p / "state.json").is_file():
        raise CheckpointError(
            f"checkpoint={path}: no checkpoint there. Pass a training run directory (it holds checkpoints/latest) "
            "or one of its checkpoints/step_NNNNNN folders; leave checkpoint out to evaluate the model's own weights")
    return p


class EvaluationRun(TrainingRun):
    def __init__(self, cfg: TrainConfig, config_yaml: str = "", resolved: dict[str, Any] | None = None,
                 sweep: str | None = None) -> None:
        # the trajectories x turns shape of every row comes from eval.*, not from the training knobs
        super().__init__(replace(cfg, n_trajectories=cfg.eval.n_trajectories, n_turns=cfg.eval.n_turns), config_yaml,
                         resolved, sweep)

    def setup(self) -> None:
        cfg = self.cfg
        if cfg.eval.n_trajectories < 1 or cfg.eval.n_turns < 1 or cfg.eval.tasks_per_batch < 1:
            raise ValueError("eval.n_trajectories, eval.n_turns and eval.tasks_per_batch must be >= 1")
        checkpoint = find_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
        super().setup()  # policy, tasks, environment, records (an evaluation directory holds no checkpoints)
        self.policy_step = 0
        if checkpoint is not None:
            state = torch.load(checkpoint / "policy.pt", map_location="cpu")
            try:
                self.policy.model.load_state_dict(state)
            except RuntimeError as e:
                first = str(e).strip().splitlines()[1:2]
                raise CheckpointError(f"checkpoint={cfg.checkpoint}: its weights do not fit model={cfg.model.name} "
                                      f"({first[0].strip() if first else e}); pass the model it was trained with") from None
            self.policy_step = int(json.loads((checkpoint / "state.json").read_text())["step"]) + 1
        self.checkpoint_path = str(checkpoint) if checkpoint else None

    def _batches(self) -> list[list]:
        """Fixed batches of the task list, so a resumed evaluation samples exactly as an uninterrupted one."""
        n = self.cfg.eval.tasks_per_batch
        return [self.pool[i:i + n] for i in range(0, len(self.pool), n)]

    def drop_unfinished_rows(self) -> None:
        """Batches whose every task has all its rows stay; other rows are dropped (their batch runs again)."""
        path = self.records.turns_path
        rows = read_jsonl(path)
        per_task: dict[str, int] = {}
        for r in rows:
            per_task[r["task_id"]] = per_task.get(r["task_id"], 0) + 1
        full = self.cfg.eval.n_trajectories * self.cfg.eval.n_turns
        done = {t.problem_id for batch in self._batches() if all(per_task.get(t.problem_id) == full for t in batch)
                for t in batch}
        kept = [r for r in rows if r["task_id"] in done]
        if len(kept) != len(rows):
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            log.info("dropped %d rows of unfinished batches; they run again", len(rows) - len(kept))
        self.done_tasks = done

    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        batches = [b for b in self._batches() if any(t.problem_id not in self.done_tasks for t in b)]
        progress = Progress(cfg.logger.progress, len(batches), 0, cfg.n_turns)
        settings = RolloutSettings(cfg.n_trajectories, cfg.n_turns, cfg.rollout.max_new_tokens,
                                   cfg.rollout.max_prompt_tokens, cfg.rollout.temperature, cfg.rollout.top_p,
                                   overlap=False)
        summaries = []
        try:
            for b, batch in enumerate(batches):
                # the seed depends on the batch's tasks, not on how many batches ran before it
                seed = step_seed(cfg.seed, sum(self.pool.index(t) for t in batch))
                samples, times = run_rollout(batch, self.generator, self.env, self.encode_prompt, self.count_tokens,
                                             settings, seed=seed, on_turn=lambda turn, group, s: progress.turn(b, turn, 0, s))
                assign_credit(samples, cfg.algorithm)
                rows = [{**self.turn_row(self.policy_step, s), "split": "eval", "checkpoint": self.checkpoint_path}
                        for s in samples]
                self.records.append_turns(rows)
                correct = sum(s.result.correct for s in samples) / max(1, len(samples))
                summaries.append({"batch": b, "tasks": [t.problem_id for t in batch], "correct_ratio": correct,
                                  "generate_s": times.generate_s, "evaluate_s": times.evaluate_s})
                log.info("evaluated %s: %.0f%% of kernels correct", ", ".join(t.problem_id for t in batch), 100 * correct)
        finally:
            progress.close()
            self.metric_logger.close()
            self.records.close()
            self.env.close()
        return summaries
