"""The rollout's schedules produce the same samples: a trajectory's next turn goes on as soon as its own verdict
is in (pipeline), or after half the tasks' (halves), or after all of them (barrier). A real tiny model samples
(a seed per sample), and an environment whose verdicts land on another thread, after delays of their own, scores
deterministically."""
from __future__ import annotations

import threading
import time
from typing import Callable

import pytest

from kevin_exp.config import ModelConfig
from kevin_exp.models import Policy, chat_prompt_ids, load_policy
from kevin_exp.rollout.env import TurnResult
from kevin_exp.rollout.generation import HFGenerator
from kevin_exp.rollout.loop import RolloutSettings, run_rollout, sample_seed
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.tasks.loader import load_builtin

N_TRAJ, N_TURNS = 3, 3


class DelayedEnv:
    """Scores a response by its tokens (deterministic); in a stream, each verdict lands on a timer thread after a
    delay that depends on the response, so verdicts arrive out of order."""

    backend = "synthetic"

    def __init__(self) -> None:
        self.outstanding = 0
        self.lock = threading.Lock()
        self.overlapped_calls = 0

    def prompt(self, task, history, max_tokens, count_tokens):
        return "\n".join([f"Task {task.problem_id}"] + [a.feedback for a in history]), 0

    def result(self, response_ids: list[int]) -> TurnResult:
        score = sum(response_ids) % 97 / 97
        return TurnResult(status="ok", correct=True, score=score, attempt=Attempt(None, "", "ok", f"score {score:.3f}", score),
                          speedup=score)

    def step(self, tasks, responses, response_ids, histories=None):
        return [self.result(ids) for ids in response_ids]

    def scorer(self):
        env = self

        class Stream:
            def submit(self, task, response, response_ids, done: Callable[[TurnResult], None], history=()) -> None:
                with env.lock:
                    env.outstanding += 1

                def land() -> None:
                    with env.lock:
                        env.outstanding -= 1
                    done(env.result(response_ids))

                threading.Timer(0.02 + (sum(response_ids) % 7) * 0.03, land).start()

            def close(self) -> None:
                pass

        return Stream()


class WatchingGenerator(HFGenerator):
    """Notes how many verdicts were outstanding at each generate call."""

    def __init__(self, policy: Policy, env: DelayedEnv) -> None:
        super().__init__(policy, batch_size=16)
        self.env, self.outstanding_at_calls = env, []

    def generate(self, prompts, *args, **kwargs):
        self.outstanding_at_calls.append(self.env.outstanding)
        return super().generate(prompts, *args, **kwargs)


@pytest.fixture(scope="module")
def tiny() -> Policy:
    return load_policy(ModelConfig(source="tiny", name="tiny"))


def _rollout(tiny: Policy, schedule: str):
    env = DelayedEnv()
    gen = WatchingGenerator(tiny, env)
    tasks = load_builtin()[:2]
    settings = RolloutSettings(N_TRAJ, N_TURNS, max_new_tokens=6, max_prompt_tokens=512, temperature=0.9, top_p=1.0,
                               schedule=schedule)
    samples, times = run_rollout(tasks, gen, env, lambda text: chat_prompt_ids(tiny.tokenizer, text),
                                 lambda text: len(tiny.tokenizer.encode(text)), settings, seed=11)
    return samples, times, gen


def _fields(samples):
    return [(s.task.problem_id, s.trajectory, s.turn, s.prompt_ids, s.response_ids, s.result.score,
             s.result.attempt.feedback) for s in samples]


def _same_logprobs(a, b) -> None:
    # rows padded differently in another batch: fp32 sums in another order, ~1e-6 apart
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_pipelined_halves_and_barrier_rollouts_give_the_same_samples(tiny):
    barrier, _, barrier_gen = _rollout(tiny, "barrier")
    pipelined, times, gen = _rollout(tiny, "pipeline")
    halves, _, _ = _rollout(tiny, "halves")
    assert _fields(pipelined) == _fields(barrier) == _fields(halves)
    _same_logprobs(pipelined, barrier)
    _same_logprobs(halves, barrier)
    assert len(pipelined) == 2 * N_TRAJ * N_TURNS
    # the barrier schedule generates a turn once every verdict of the one before is in; the pipeline generates
    # trajectories whose verdicts landed while others were still being evaluated
    assert barrier_gen.outstanding_at_calls == [0] * N_TURNS
    assert any(n > 0 for n in gen.outstanding_at_calls), gen.outstanding_at_calls
    assert len(gen.outstanding_at_calls) > N_TURNS
    assert 0 < times.evaluate_wait_s <= times.evaluate_s


def test_a_samples_seed_depends_on_task_trajectory_and_turn_only():
    seeds = {sample_seed(5, task, traj, turn) for task in range(8) for traj in range(16) for turn in range(8)}
    assert len(seeds) == 8 * 16 * 8
    assert sample_seed(5, 1, 2, 3) == sample_seed(5, 1, 2, 3) != sample_seed(6, 1, 2, 3)


def test_a_rows_sample_does_not_depend_on_the_rows_beside_it(tiny):
    prompts = [chat_prompt_ids(tiny.tokenizer, q) for q in ("a", "bb", "ccc kernel", "d")]
    gen = HFGenerator(tiny, batch_size=16)
    together = gen.generate(prompts, 8, 0.9, 1.0, seed=0, seeds=[1, 2, 3, 4])
    alone = [gen.generate([p], 8, 0.9, 1.0, seed=99, seeds=[s])[0] for p, s in zip(prompts, [1, 2, 3, 4])]
    assert [g.response_ids for g in together] == [g.response_ids for g in alone]
    for a, b in zip(together, alone):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    other = gen.generate(prompts, 8, 0.9, 1.0, seed=0, seeds=[5, 6, 7, 8])
    assert [g.response_ids for g in other] != [g.response_ids for g in together]


def test_an_unknown_schedule_is_refused(tiny):
    with pytest.raises(ValueError, match="schedule='round_robin'"):
        _rollout(tiny, "round_robin")


def test_the_pipeline_waits_only_when_nothing_is_ready(tiny):
    start = time.perf_counter()
    _, times, _ = _rollout(tiny, "pipeline")
    wall = time.perf_counter() - start
    assert times.generate_s + times.evaluate_wait_s <= wall + 1e-3
