"""The environment a rollout talks to: it writes each turn's prompt and scores each turn's response.

``KernelEnv`` is the real one (the evaluator in ``kevin_exp.bench``); ``SyntheticEnv`` scores responses
without compiling anything, for learning tests. Both score a whole turn of responses in one call (``step``),
so the evaluator sees a batch, or one response at a time as it comes (``scorer()``: a stream whose results are
delivered as they land, for a rollout that does not wait for a whole turn).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from kevin_exp.rl.reward import counted_speedup, turn_score
from kevin_exp.rollout.parsing import ParsedResponse, parse_response
from kevin_exp.rollout.prompts import Attempt, turn_prompt
from kevin_exp.tasks import Problem


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """One turn's outcome, from the verdict to the row (``records.rows.turn_row``) under the same names."""

    status: str
    correct: bool
    score: float
    # what the next prompt shows about this turn
    attempt: Attempt
    speedup: float | None = None
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    reason: str = ""
    device: str = ""
    excessive_speedup: bool = False
    # the evaluator did not believe the timing (re-timed elsewhere, or inconsistent with its outside clock)
    suspect: bool = False
    # the rule behind a forbidden or suspect verdict (``recheck_disagrees``, ``hidden_time``, a static rule, ...)
    rule: str | None = None


@dataclass(frozen=True)
class ScoreWeights:
    """The reward's settings (a run's: ``run.setup.score_weights``): the weights of a correct kernel and of its
    speedup, and the cap on the speedup term (0: none)."""

    correctness: float = 0.3
    speedup: float = 1.0
    max_speedup: float = 0.0


class TurnScorer(Protocol):
    def submit(self, task: Problem, response: str, response_ids: list[int], done: Callable[[TurnResult], None],
               history: Sequence[Attempt] = ()) -> None:
        """Score one response (``history``: its trajectory's earlier attempts); ``done`` gets its result as soon as
        it is known (on any thread)."""
        ...

    def close(self) -> None:
        ...


class Environment(Protocol):
    backend: str

    def scorer(self) -> TurnScorer:
        """A stream of single responses to score (closed by the caller once every result has landed)."""
        ...

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        """The user message for the next turn and how many earlier attempts were dropped to fit."""
        ...

    def step(self, tasks: Sequence[Problem], responses: Sequence[str], response_ids: Sequence[list[int]],
             histories: Sequence[Sequence[Attempt]] | None = None) -> list[TurnResult]:
        """Score one response per task (one batch; ``histories``: each trajectory's earlier attempts)."""
        ...

    def close(self) -> None:
        ...


class KernelEnv:
    """Responses are parsed, their kernels compiled, checked and timed by the evaluator."""

    def __init__(self, evaluator, weights: ScoreWeights = ScoreWeights()) -> None:
        self.evaluator = evaluator
        self.backend = evaluator.config.backend
        self.weights = weights

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        return turn_prompt(task.source, self.backend, history, max_tokens, count_tokens)

    def step(self, tasks: Sequence[Problem], responses: Sequence[str], response_ids: Sequence[list[int]],
             histories: Sequence[Sequence[Attempt]] | None = None) -> list[TurnResult]:
        # lazy: the records' readers (kevin_exp.show, transcripts) import this module and need no evaluator
        from kevin_exp.bench.evaluator import EvalItem

        histories = histories if histories is not None else [()] * len(tasks)
        parsed = [self.parse(t, text, h) for t, text, h in zip(tasks, responses, histories)]
        items = [EvalItem(t.problem_id, t.source, p.code) for t, p in zip(tasks, parsed) if p.ok]
        verdicts = iter(self.evaluator.evaluate(items)) if items else iter(())
        return [self._result(p, next(verdicts) if p.ok else None) for p in parsed]

    def scorer(self) -> "TurnScorer":
        return _KernelScorer(self)

    def parse(self, task: Problem, text: str, history: Sequence[Attempt] = ()) -> ParsedResponse:
        """The candidate program a response submits (``MenuEnv`` reads a menu letter instead, which may mean what
        the trajectory's earlier attempts made of it)."""
        return parse_response(text)

    def _result(self, p, verdict) -> TurnResult:
        """A parsed response's result: a format error, or its verdict scored."""
        if verdict is None:
            attempt = Attempt(None, p.summary, "format_error", p.error)
            return TurnResult(status="format_error", correct=False, score=0.0, attempt=attempt, reason=p.error)
        v = verdict
        w = self.weights
        score = turn_score(v.correct, v.speedup, w.correctness, w.speedup, w.max_speedup)
        attempt = Attempt(p.code, p.summary, v.status.value, v.feedback, counted_speedup(v.correct, v.speedup))
        return TurnResult(status=v.status.value, correct=v.correct, score=score, attempt=attempt, speedup=v.speedup,
                          runtime_ms=v.runtime_ms, ref_runtime_ms=v.ref_runtime_ms, reason=v.reason, device=v.device,
                          excessive_speedup=v.excessive_speedup, suspect=v.status.value == "suspect", rule=v.rule)

    def close(self) -> None:
        self.evaluator.close()


class _KernelScorer:
    """KernelEnv's stream: a format error is scored at once, a kernel goes to an evaluation session."""

    def __init__(self, env: KernelEnv) -> None:
        self.env = env
        self.session = env.evaluator.session()

    def submit(self, task: Problem, response: str, response_ids: list[int], done: Callable[[TurnResult], None],
               history: Sequence[Attempt] = ()) -> None:
        from kevin_exp.bench.evaluator import EvalItem  # lazy, as in KernelEnv.step

        p = self.env.parse(task, response, history)
        if not p.ok:
            done(self.env._result(p, None))
            return
        self.session.submit(EvalItem(task.problem_id, task.source, p.code), lambda v: done(self.env._result(p, v)))

    def close(self) -> None:
        self.session.close()


class ScoredAtOnce:
    """The stream of an environment that scores without waiting (each response through ``step``)."""

    def __init__(self, env: "Environment") -> None:
        self.env = env

    def submit(self, task: Problem, response: str, response_ids: list[int], done: Callable[[TurnResult], None],
               history: Sequence[Attempt] = ()) -> None:
        done(self.env.step([task], [response], [response_ids], [history])[0])

    def close(self) -> None:
        pass


class SyntheticEnv:
    """A compile-free reward behind the same interface: the share of response tokens whose id lies in
    ``[0, target_below)``. A policy learns it by shifting mass to those tokens; used by learning tests."""

    backend = "synthetic"

    def __init__(self, target_below: int) -> None:
        self.target_below = target_below

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        lines = [f"Task {task.problem_id}: write tokens."] + [f"Attempt {i + 1}: {a.feedback}" for i, a in enumerate(history)]
        return "\n".join(lines), 0

    def step(self, tasks: Sequence[Problem], responses: Sequence[str], response_ids: Sequence[list[int]],
             histories: Sequence[Sequence[Attempt]] | None = None) -> list[TurnResult]:
        out = []
        for ids in response_ids:
            share = sum(1 for i in ids if i < self.target_below) / max(1, len(ids))
            attempt = Attempt(None, "", "ok", f"score {share:.2f}", share)
            out.append(TurnResult(status="ok", correct=True, score=share, attempt=attempt, speedup=share))
        return out

    def scorer(self) -> ScoredAtOnce:
        return ScoredAtOnce(self)

    def close(self) -> None:
        pass
