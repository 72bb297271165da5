"""One training step's rollout: tasks x parallel trajectories x refinement turns.

Every live trajectory of a turn is generated in one batched call per task group; the group's responses
go to the environment as one batch. With ``overlap`` the tasks are split into two groups and one group
is evaluated (in a background thread) while the other is being generated.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kevin_exp.rollout.env import Environment, TurnResult
from kevin_exp.rollout.generation import Generator
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.tasks import Problem


@dataclass
class TurnSample:
    task: Problem
    trajectory: int
    turn: int
    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    truncated: bool
    dropped_attempts: int
    result: TurnResult
    # the generator's log-probs of response_ids as sampled (empty when the generator does not report them)
    logprobs: list[float] = field(default_factory=list)
    # filled by the learner: the discounted return and the advantage
    ret: float = 0.0
    advantage: float = 0.0


@dataclass(frozen=True)
class RolloutSettings:
    n_trajectories: int
    n_turns: int
    max_new_tokens: int
    max_prompt_tokens: int
    temperature: float
    top_p: float
    overlap: bool = True


@dataclass
class RolloutTimes:
    generate_s: float = 0.0
    evaluate_s: float = 0.0
    # evaluation time not hidden behind generation
    evaluate_wait_s: float = 0.0


@dataclass
class _Trajectory:
    task: Problem
    index: int
    history: list[Attempt] = field(default_factory=list)


def run_rollout(
    tasks: Sequence[Problem],
    generator: Generator,
    env: Environment,
    encode_prompt: Callable[[str], list[int]],
    count_tokens: Callable[[str], int],
    settings: RolloutSettings,
    seed: int,
    on_turn: Callable[[int, int, float], None] | None = None,
) -> tuple[list[TurnSample], RolloutTimes]:
    """Returns the samples ordered by (task, trajectory, turn) and where the time went."""
    trajectories = [_Trajectory(t, j) for t in tasks for j in range(settings.n_trajectories)]
    n_groups = 2 if settings.overlap and len(tasks) >= 2 else 1
    per_group = -(-len(tasks) // n_groups)
    width = per_group * settings.n_trajectories
    groups = [trajectories[g * width : (g + 1) * width] for g in range(n_groups)]
    groups = [g for g in groups if g]
    samples: dict[tuple[str, int, int], TurnSample] = {}
    times = RolloutTimes()
    pending: dict[int, tuple[Future, list[TurnSample]]] = {}

    def collect(gi: int) -> None:
        fut, turn_samples = pending.pop(gi)
        t0 = time.perf_counter()
        results, seconds = fut.result()
        times.evaluate_wait_s += time.perf_counter() - t0
        times.evaluate_s += seconds
        for trajectory, sample, result in zip(groups[gi], turn_samples, results):
            sample.result = result
            trajectory.history.append(result.attempt)

    def evaluate(batch: list[TurnSample]) -> tuple[list[TurnResult], float]:
        t0 = time.perf_counter()
        results = env.step([s.task for s in batch], [s.text for s in batch], [s.response_ids for s in batch])
        return results, time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluate") as pool:
        try:
            for turn in range(settings.n_turns):
                for gi, group in enumerate(groups):
                    if gi in pending:
                        collect(gi)
                    prompts, dropped = [], []
                    for traj in group:
                        text, n_dropped = env.prompt(traj.task, traj.history, settings.max_prompt_tokens, count_tokens)
                        prompts.append(encode_prompt(text))
                        dropped.append(n_dropped)
                    t0 = time.perf_counter()
                    gens = generator.generate(prompts, settings.max_new_tokens, settings.temperature, settings.top_p,
                                              seed=_generation_seed(seed, turn, gi))
                    seconds = time.perf_counter() - t0
                    times.generate_s += seconds
                    batch = []
                    for traj, gen, n_dropped in zip(group, gens, dropped):
                        sample = TurnSample(traj.task, traj.index, turn, gen.prompt_ids, gen.response_ids, gen.text,
                                            gen.truncated, n_dropped, result=None,  # type: ignore[arg-type]
                                            logprobs=list(gen.logprobs))
                        samples[(traj.task.problem_id, traj.index, turn)] = sample
                        batch.append(sample)
                    pending[gi] = (pool.submit(evaluate, batch), batch)
                    if on_turn is not None:
                        on_turn(turn, gi, seconds)
            for gi in list(pending):
                collect(gi)
        finally:
            for fut, _ in pending.values():
                fut.cancel()
    ordered = [samples[(t.problem_id, j, k)] for t in tasks for j in range(settings.n_trajectories) for k in range(settings.n_turns)]
    return ordered, times


def _generation_seed(seed: int, turn: int, group: int) -> int:
    # a pure function of (run seed, step seed, turn, group): a resumed run samples the same tokens
    return (seed * 1_000_003 + turn * 7919 + group * 104_729) % (2**31 - 1)
