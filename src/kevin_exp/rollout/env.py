"""The environment a rollout talks to: it writes each turn's prompt and scores each turn's response.

``KernelEnv`` is the real one (the evaluator in ``kevin_exp.bench``); ``SyntheticEnv`` scores responses
without compiling anything, for learning tests. Both score a whole turn of responses in one call, so the
evaluator sees a batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from kevin_exp.rl.reward import turn_score
from kevin_exp.rollout.parsing import parse_response
from kevin_exp.rollout.prompts import Attempt, turn_prompt
from kevin_exp.tasks import Problem


@dataclass(frozen=True)
class TurnResult:
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


@dataclass(frozen=True)
class ScoreWeights:
    correctness: float = 0.3
    speedup: float = 1.0
    # cap on the speedup term (None or 0: none); KernelEnv takes the evaluator's max_speedup when this is None
    max_speedup: float | None = None


class Environment(Protocol):
    backend: str

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        """The user message for the next turn and how many earlier attempts were dropped to fit."""
        ...

    def step(self, tasks: Sequence[Problem], responses: Sequence[str], response_ids: Sequence[list[int]]) -> list[TurnResult]:
        """Score one response per task (one batch)."""
        ...

    def close(self) -> None:
        ...


class KernelEnv:
    """Responses are parsed, their kernels compiled, checked and timed by the evaluator."""

    def __init__(self, evaluator, weights: ScoreWeights = ScoreWeights()) -> None:
        self.evaluator = evaluator
        self.backend = evaluator.config.backend
        self.weights = weights
        self.max_speedup = weights.max_speedup if weights.max_speedup is not None else getattr(evaluator.config, "max_speedup", 0.0)

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        return turn_prompt(task.source, self.backend, history, max_tokens, count_tokens)

    def step(self, tasks: Sequence[Problem], responses: Sequence[str], response_ids: Sequence[list[int]]) -> list[TurnResult]:
        from kevin_exp.bench.evaluator import EvalItem

        parsed = [parse_response(text) for text in responses]
        items = [EvalItem(t.problem_id, t.source, p.code) for t, p in zip(tasks, parsed) if p.ok]
        verdicts = iter(self.evaluator.evaluate(items)) if items else iter(())
        results = []
        for p in parsed:
            if not p.ok:
                attempt = Attempt(None, p.summary, "format_error", p.error)
                results.append(TurnResult("format_error", False, 0.0, attempt, reason=p.error))
                continue
            v = next(verdicts)
            score = turn_score(v.correct, v.speedup, self.weights.correctness, self.weights.speedup, self.max_speedup)
            attempt = Attempt(p.code, p.summary, v.status.value, v.feedback, v.speedup if v.correct else None)
            results.append(TurnResult(v.status.value, v.correct, score, attempt, v.speedup, v.runtime_ms,
                                      v.ref_runtime_ms, v.reason, v.device, v.excessive_speedup,
                                      suspect=v.status.value == "suspect"))
        return results

    def close(self) -> None:
        self.evaluator.close()


class SyntheticEnv:
    """A compile-free reward behind the same interface: the share of response tokens whose id lies in
    ``[0, target_below)``. A policy learns it by shifting mass to those tokens; used by learning tests."""

    backend = "synthetic"

    def __init__(self, target_below: int) -> None:
        self.target_below = target_below

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        lines = [f"Task {task.problem_id}: write tokens."] + [f"Attempt {i + 1}: {a.feedback}" for i, a in enumerate(history)]
        return "\n".join(lines), 0

    def step(self, tasks: Sequence[Problem], responses: Sequence[str], response_ids: Sequence[list[int]]) -> list[TurnResult]:
        out = []
        for ids in response_ids:
            share = sum(1 for i in ids if i < self.target_below) / max(1, len(ids))
            attempt = Attempt(None, "", "ok", f"score {share:.2f}", share)
            out.append(TurnResult("ok", True, share, attempt, speedup=share))
        return out

    def close(self) -> None:
        pass
