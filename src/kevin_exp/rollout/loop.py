"""One training step's rollout: tasks x parallel trajectories x refinement turns.

Three schedules (``rollout.schedule``), with the same samples and records:

- ``pipeline`` (default): a trajectory's next turn depends only on its own feedback, so it is generated as soon
  as its verdict is in, in one batch with whatever else is ready then; each response goes to the environment's
  stream (``Environment.scorer``) the moment it is generated. Generation of some trajectories overlaps the
  evaluation of the others; the rollout waits only when nothing is ready to generate.
- ``halves``: the tasks are split into two groups; one group's turn is evaluated (as one batch, in a background
  thread) while the other's is generated.
- ``barrier``: every turn waits for all of its verdicts.

Each sample is drawn with a seed of its own, a function of (the step's seed, task, trajectory, turn), so what a
trajectory generates does not depend on what it was batched with.

A caller that shows progress within a turn passes ``on_progress``: it is called with the rollout's ``RolloutCounts``
whenever they change (a generate() call starts, draws a token, ends; a verdict lands, on the environment's thread).
"""
from __future__ import annotations

import hashlib
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kevin_exp.rollout.env import Environment, TurnResult
from kevin_exp.rollout.generation import Generator, reporting_progress
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
    # filled after the rollout by the step (run/step.py, assign_credit): the discounted return and the advantage
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
    schedule: str = "pipeline"


SCHEDULES = ("pipeline", "halves", "barrier")


@dataclass
class RolloutTimes:
    generate_s: float = 0.0
    # seconds in evaluation (pipeline: wall time with at least one verdict outstanding)
    evaluate_s: float = 0.0
    # evaluation time not hidden behind generation: the rollout waited on verdicts with nothing to generate
    evaluate_wait_s: float = 0.0


class RolloutCounts:
    """How far a rollout is, for a progress display: per turn (0-based), how many of its ``per_turn`` sequences
    are generated and how many of their verdicts are in; and the generate() call under way, if any. Changed under
    a lock (verdicts land on the environment's threads); ``listener`` is called after every change."""

    def __init__(self, n_turns: int, per_turn: int, max_new_tokens: int,
                 listener: Callable[[RolloutCounts], None] | None = None) -> None:
        self.n_turns, self.per_turn, self.max_new_tokens = n_turns, per_turn, max_new_tokens
        self.generated, self.evaluated = [0] * n_turns, [0] * n_turns
        # the generate() call under way: its sequences, how many of them are finished, the tokens drawn so far by
        # the batch it is sampling now (0 where the generator does not say), and the turns it generates
        self.calling, self.call_done, self.call_tokens = 0, 0, 0
        self.call_turns: frozenset[int] = frozenset()
        self.listener = listener
        self._lock = threading.Lock()

    def start_call(self, turns: Sequence[int]) -> None:
        """A generate() call starts, one sequence per entry of ``turns`` (the turn it generates)."""
        with self._lock:
            self.calling, self.call_done, self.call_tokens, self.call_turns = len(turns), 0, 0, frozenset(turns)
        self._changed()

    def in_call(self, done: int, tokens: int) -> None:
        with self._lock:
            self.call_done, self.call_tokens = done, tokens
        self._changed()

    def end_call(self, turns: Sequence[int]) -> None:
        with self._lock:
            self.calling = self.call_done = self.call_tokens = 0
            self.call_turns = frozenset()
            for turn in turns:
                self.generated[turn] += 1
        self._changed()

    def verdicts(self, turn: int, n: int = 1) -> None:
        with self._lock:
            self.evaluated[turn] += n
        self._changed()

    def snapshot(self) -> tuple:
        """Everything counted, as one value (to tell whether anything changed since a line was shown)."""
        with self._lock:
            return (tuple(self.generated), tuple(self.evaluated), self.calling, self.call_done, self.call_tokens)

    def _changed(self) -> None:
        if self.listener is not None:
            self.listener(self)


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
    on_progress: Callable[[RolloutCounts], None] | None = None,
) -> tuple[list[TurnSample], RolloutTimes]:
    """Returns the samples ordered by (task, trajectory, turn) and where the time went. ``on_turn(turn, group,
    generate_s)``: once per turn and group, when it is first generated; ``on_progress``: module doc."""
    if settings.schedule not in SCHEDULES:
        raise ValueError(f"schedule={settings.schedule!r}: expected one of {', '.join(SCHEDULES)}")
    counts = RolloutCounts(settings.n_turns, len(tasks) * settings.n_trajectories, settings.max_new_tokens, on_progress)
    listening = reporting_progress(counts.in_call if on_progress is not None else None)
    if settings.schedule == "pipeline":
        with listening:
            return _pipelined(tasks, generator, env, encode_prompt, count_tokens, settings, seed, on_turn, counts)
    trajectories = [_Trajectory(t, j) for t in tasks for j in range(settings.n_trajectories)]
    positions = {t.problem_id: k for k, t in enumerate(tasks)}
    n_groups = 2 if settings.schedule == "halves" and len(tasks) >= 2 else 1
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

    def evaluate(batch: list[TurnSample], histories: list[list[Attempt]]) -> tuple[list[TurnResult], float]:
        t0 = time.perf_counter()
        results = env.step([s.task for s in batch], [s.text for s in batch], [s.response_ids for s in batch], histories)
        counts.verdicts(batch[0].turn, len(batch))
        return results, time.perf_counter() - t0

    with listening, ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluate") as pool:
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
                    counts.start_call([turn] * len(group))
                    gens = generator.generate(prompts, settings.max_new_tokens, settings.temperature, settings.top_p,
                                              seed=_generation_seed(seed, turn, gi),
                                              seeds=[sample_seed(seed, positions[t.task.problem_id], t.index, turn)
                                                     for t in group],
                                              trajectories=[t.index for t in group])
                    seconds = time.perf_counter() - t0
                    times.generate_s += seconds
                    counts.end_call([turn] * len(group))
                    batch = []
                    for traj, gen, n_dropped in zip(group, gens, dropped):
                        sample = TurnSample(traj.task, traj.index, turn, gen.prompt_ids, gen.response_ids, gen.text,
                                            gen.truncated, n_dropped, result=None,  # type: ignore[arg-type]
                                            logprobs=list(gen.logprobs))
                        samples[(traj.task.problem_id, traj.index, turn)] = sample
                        batch.append(sample)
                    pending[gi] = (pool.submit(evaluate, batch, [list(t.history) for t in group]), batch)
                    if on_turn is not None:
                        on_turn(turn, gi, seconds)
            for gi in list(pending):
                collect(gi)
        finally:
            for fut, _ in pending.values():
                fut.cancel()
    ordered = [samples[(t.problem_id, j, k)] for t in tasks for j in range(settings.n_trajectories) for k in range(settings.n_turns)]
    return ordered, times


def _pipelined(tasks, generator, env, encode_prompt, count_tokens, settings: RolloutSettings, seed: int,
               on_turn, counts: RolloutCounts) -> tuple[list[TurnSample], RolloutTimes]:
    """The ``pipeline`` schedule (module doc). Verdicts arrive on the environment's threads and are handed over
    through a queue; prompts, generation and records stay on this thread."""
    trajectories = [_Trajectory(t, j) for t in tasks for j in range(settings.n_trajectories)]
    positions = {t.problem_id: k for k, t in enumerate(tasks)}
    samples: dict[tuple[str, int, int], TurnSample] = {}
    landed: queue.Queue[tuple[_Trajectory, TurnSample, TurnResult]] = queue.Queue()
    times = RolloutTimes()
    ready, outstanding, calls, reported = list(trajectories), 0, 0, -1
    busy_since = 0.0  # when the outstanding count last rose from 0

    def take(item: tuple[_Trajectory, TurnSample, TurnResult]) -> None:
        nonlocal outstanding
        traj, sample, result = item
        sample.result = result
        traj.history.append(result.attempt)
        outstanding -= 1
        if not outstanding:
            times.evaluate_s += time.perf_counter() - busy_since
        if len(traj.history) < settings.n_turns:
            ready.append(traj)

    def land(traj: _Trajectory, sample: TurnSample, result: TurnResult) -> None:
        """A verdict, on the environment's thread (or this one, for an environment that scores at once)."""
        counts.verdicts(sample.turn)
        landed.put((traj, sample, result))

    scorer = env.scorer()
    try:
        while ready or outstanding:
            if not ready:
                t0 = time.perf_counter()
                take(landed.get())
                times.evaluate_wait_s += time.perf_counter() - t0
            while True:  # everything else that has landed meanwhile
                try:
                    take(landed.get_nowait())
                except queue.Empty:
                    break
            if not ready:  # what landed were last turns
                continue
            batch, ready = sorted(ready, key=lambda t: (positions[t.task.problem_id], t.index)), []
            prompts, dropped = [], []
            for traj in batch:
                text, n_dropped = env.prompt(traj.task, traj.history, settings.max_prompt_tokens, count_tokens)
                prompts.append(encode_prompt(text))
                dropped.append(n_dropped)
            turns = [len(t.history) for t in batch]
            t0 = time.perf_counter()
            counts.start_call(turns)
            gens = generator.generate(prompts, settings.max_new_tokens, settings.temperature, settings.top_p,
                                      seed=_generation_seed(seed, calls, 0),
                                      seeds=[sample_seed(seed, positions[t.task.problem_id], t.index, k)
                                             for t, k in zip(batch, turns)],
                                      trajectories=[t.index for t in batch])
            seconds = time.perf_counter() - t0
            times.generate_s += seconds
            counts.end_call(turns)
            for traj, gen, n_dropped, turn in zip(batch, gens, dropped, turns):
                sample = TurnSample(traj.task, traj.index, turn, gen.prompt_ids, gen.response_ids, gen.text,
                                    gen.truncated, n_dropped, result=None,  # type: ignore[arg-type]
                                    logprobs=list(gen.logprobs))
                samples[(traj.task.problem_id, traj.index, turn)] = sample
                if not outstanding:
                    busy_since = time.perf_counter()
                outstanding += 1
                scorer.submit(traj.task, gen.text, gen.response_ids,
                              lambda result, item=(traj, sample): land(*item, result), list(traj.history))
            if on_turn is not None and max(turns) > reported:  # progress: once per turn, when it is first generated
                reported = max(turns)
                on_turn(reported, 0, seconds)
            calls += 1
    finally:
        scorer.close()
    ordered = [samples[(t.problem_id, j, k)] for t in tasks for j in range(settings.n_trajectories) for k in range(settings.n_turns)]
    return ordered, times


def sample_seed(seed: int, task: int, trajectory: int, turn: int) -> int:
    """The seed of one sample: a function of (the step's seed, the task's position in the step, trajectory,
    turn), whatever schedule or batch generated it."""
    digest = hashlib.blake2b(f"{seed}/{task}/{trajectory}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


def _generation_seed(seed: int, turn: int, group: int) -> int:
    # a pure function of (run seed, step seed, turn, group): a resumed run samples the same tokens
    return (seed * 1_000_003 + turn * 7919 + group * 104_729) % (2**31 - 1)
