"""What one step of either loop does with its tasks, shared by the training and the evaluation loop: which tasks
(a seeded sample of the pool, split into contiguous shares over ranks), the seed of its rollouts, the rollout's
settings, and the credit each turn gets (discounted return, group-normalised advantage)."""
from __future__ import annotations

import random

from kevin_exp.config import TrainConfig
from kevin_exp.rl.credit import turn_credit
from kevin_exp.rollout.loop import RolloutSettings, TurnSample
from kevin_exp.tasks import Problem


def pick_tasks(pool: list[Problem], k: int, seed: int, step: int) -> list[Problem]:
    rng = random.Random(f"{seed}/{step}")
    return rng.sample(pool, min(k, len(pool)))


def assign_credit(samples: list[TurnSample], cfg: TrainConfig) -> None:
    """Each sample's discounted return and group-normalised advantage (Kevin's per-turn credit)."""
    algo = cfg.algorithm
    returns, advantages = turn_credit(
        [s.result.score for s in samples], [s.task.problem_id for s in samples], [s.trajectory for s in samples],
        [s.turn for s in samples], cfg.gamma, algo.aggregation, algo.estimator, algo.scale_by_std,
    )
    for s, r, a in zip(samples, returns, advantages):
        s.ret, s.advantage = r, a


def rank_share(tasks: list[Problem], rank: int, world_size: int) -> list[Problem]:
    """Rank ``rank``'s contiguous share of the step's tasks (the first ranks take one more when uneven)."""
    base, extra = divmod(len(tasks), world_size)
    start = rank * base + min(rank, extra)
    return tasks[start : start + base + (rank < extra)]


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 65_537) % (2**31 - 1)


def rollout_settings(cfg: TrainConfig, n_trajectories: int, n_turns: int, schedule: str) -> RolloutSettings:
    return RolloutSettings(n_trajectories, n_turns, cfg.rollout.max_new_tokens, cfg.rollout.max_prompt_tokens,
                           cfg.rollout.temperature, cfg.rollout.top_p, schedule)
