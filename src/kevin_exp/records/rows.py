"""The rows a run appends to its records: one per (step, task, trajectory, turn) in ``turns.jsonl`` and one
per step in ``metrics.jsonl``. Both carry the training settings of the policy they describe (for an
evaluation: the checkpoint's), so tables group runs by what was trained."""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping

import numpy as np

from kevin_exp.config import TrainConfig
from kevin_exp.rl.reward import counted_speedup
from kevin_exp.rollout.loop import RolloutTimes, TurnSample

# measured, so they differ between two runs of the same settings (a comparison of runs leaves them out)
MEASURED_COLUMNS = ("generate_s", "evaluate_s", "evaluate_wait_s", "train_s", "step_s", "gpu_mem_peak_gb",
                    "host_rss_peak_gb", "train_tokens_per_s", "mfu", "ranks", "checkpoint_s")

def training_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The settings that define a trained policy, under the column names the analysis groups by."""
    return {"gamma": cfg.gamma, "n_turns": cfg.n_turns, "n_trajectories": cfg.n_trajectories,
            "tasks_per_step": cfg.tasks_per_step, "normalization": cfg.normalization,
            "aggregation": cfg.algorithm.aggregation, "estimator": cfg.algorithm.estimator, "model": cfg.model.name,
            "seed": cfg.seed, "experiment": cfg.experiment, "sweep_name": cfg.sweep_name}


def is_not_okay(text: str, opening: str | None) -> bool | None:
    """Kevin's instability proxy: the reasoning does not open with the model's usual opening (None: the model has
    none, and nothing is measured)."""
    if opening is None:
        return None
    body = text.lstrip()
    if body.lower().startswith("<think>"):
        body = body[len("<think>") :].lstrip()
    return not body.startswith(opening)


def turn_row(run_id: str, split: str, step: int, s: TurnSample, settings: Mapping[str, Any], usual_opening: str,
             backend: str) -> dict[str, Any]:
    r = s.result
    return {
        "run_id": run_id, "split": split, "step": step, "task_id": s.task.problem_id, "level": s.task.level,
        "trajectory": s.trajectory, "turn": s.turn + 1, "status": r.status, "correct": r.correct,
        "speedup": counted_speedup(r.correct, r.speedup), "runtime_ms": r.runtime_ms, "ref_runtime_ms": r.ref_runtime_ms,
        "score": r.score, "return": s.ret, "advantage": s.advantage, "response_tokens": len(s.response_ids),
        "prompt_tokens": len(s.prompt_ids), "dropped_attempts": s.dropped_attempts, "truncated": s.truncated,
        "not_okay": is_not_okay(s.text, usual_opening), "excessive_speedup": r.excessive_speedup,
        "suspect": r.suspect, "rule": r.rule, "reason": r.reason[:300], "device": r.device, "backend": backend, **settings,
    }


def metrics_row(run_id: str, step: int, samples: list[TurnSample], stats: Mapping[str, Any], times: RolloutTimes,
                train_s: float, step_s: float, settings: Mapping[str, Any], usual_opening: str) -> dict[str, Any]:
    n_turns = max((s.turn + 1 for s in samples), default=0)
    per_turn = []
    for k in range(n_turns):
        turn = [s for s in samples if s.turn == k]
        per_turn.append(sum(s.result.correct for s in turn) / max(1, len(turn)))
    scores = [s.result.score for s in samples]
    speedups = [x for x in (counted_speedup(s.result.correct, s.result.speedup) for s in samples) if x is not None]
    n = max(1, len(samples))
    row: dict[str, Any] = {
        "run_id": run_id, "step": step, "samples": len(samples),
        "reward_mean": float(np.mean(scores)) if scores else 0.0, "reward_max": max(scores, default=0.0),
        "correct_ratio": sum(s.result.correct for s in samples) / n, "correct_per_turn": per_turn,
        "format_error_ratio": sum(s.result.status == "format_error" for s in samples) / n,
        "suspect_ratio": sum(s.result.suspect for s in samples) / n,
        "speedup_mean": float(np.mean(speedups)) if speedups else None,
        "status_counts": dict(Counter(s.result.status for s in samples)),
        "response_tokens_mean": float(np.mean([len(s.response_ids) for s in samples])) if samples else 0.0,
        "truncation_ratio": sum(s.truncated for s in samples) / n,
        "not_okay_ratio": (sum(is_not_okay(s.text, usual_opening) for s in samples) / n
                           if usual_opening is not None else None),
        "loss": stats["loss"], "grad_norm": stats["grad_norm"], "kl": stats["kl"], "entropy": stats["entropy"],
        "clip_fraction": stats["clip_fraction"], "lr": stats["lr"], "gradient_steps": stats["gradient_steps"],
        "logprob_diff_mean": stats["logprob_diff_mean"], "logprob_diff_max": stats["logprob_diff_max"],
        "generate_s": times.generate_s, "evaluate_s": times.evaluate_s, "evaluate_wait_s": times.evaluate_wait_s,
        "train_s": train_s, "step_s": step_s, **settings,
    }
    for k, v in enumerate(per_turn):
        row[f"correct_turn_{k + 1}"] = v
    return row


def scale_columns(world_size: int, train_tokens: float, train_s: float, gpu_mem_peak_gb: float, host_rss_peak_gb: float,
                  mfu: float | None) -> dict[str, Any]:
    """The step's scale and throughput (``metrics.jsonl``): ranks, peak GPU memory and host RSS (the max over
    ranks; GPU 0 on a CPU), the tokens the learner trained on (prompt + response of the samples run, times the
    epochs, all ranks) and their rate over the training phase, and the MFU estimate (null on a CPU or an
    unknown GPU; kevin_exp/run/throughput.py)."""
    return {"world_size": world_size, "gpu_mem_peak_gb": gpu_mem_peak_gb, "host_rss_peak_gb": host_rss_peak_gb,
            "train_tokens": int(train_tokens), "train_tokens_per_s": train_tokens / train_s if train_s > 0 else None,
            "mfu": mfu}
