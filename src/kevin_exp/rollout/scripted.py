"""A generator that answers from a script instead of a model (``rollout.backend=scripted``).

For smoke runs and tests on machines whose model cannot write a kernel (a random tiny model, SmolLM2): the
evaluator still compiles, checks and times real kernels, and everything downstream (credit, learner,
records) is real. Trajectory 0 of each task answers with the task's built-in solution, trajectory 1 with the
same code broken so it does not compile, the others with prose and no code block. It reports no sampling
log-probs (the tokens were not sampled), so ``logprob_diff`` is empty for it. With ``think_tokens`` every answer
opens with about that many tokens of reasoning-like prose, so sequences have the length of a reasoning model's.
"""
from __future__ import annotations

import re
from typing import Sequence

from kevin_exp.rollout.generation import Generation, SharesTheLearnersWeights
from kevin_exp.tasks import Problem

CODE_FENCE = "`" * 3


class ScriptedGenerator(SharesTheLearnersWeights):
    """Answers each prompt from the script above; prompts come in (task, trajectory) order, ``n_trajectories``
    per task, as the rollout loop sends them."""

    def __init__(self, tokenizer, tasks: list[Problem], backend: str, n_trajectories: int, think_tokens: int = 0) -> None:
        self.tokenizer, self.tasks, self.backend, self.n = tokenizer, tasks, backend, n_trajectories
        self.thinking = thinking_prose(tokenizer, think_tokens)

    def _task_of(self, prompt: str) -> Problem:
        hits = [t for t in self.tasks if t.source.strip() in prompt]
        assert len(hits) == 1, f"prompt matches {len(hits)} tasks"
        return hits[0]

    def response(self, task: Problem, trajectory: int) -> str:
        if trajectory == 0:
            code = task.solution(self.backend)
            return f"Okay, a direct kernel.\n{CODE_FENCE}python\n{code}\n{CODE_FENCE}\nSummary: one fused loop."
        if trajectory == 1:
            # the real solution with a C++ syntax error after its first #include
            code = re.sub(r"(#include[^\n]*\n)", r"\1int broken( {\n", task.solution(self.backend), count=1)
            return f"Okay, try this.\n{CODE_FENCE}python\n{code}\n{CODE_FENCE}\nSummary: broken."
        return "Okay, I am still thinking about the memory layout."

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int, seeds: Sequence[int] | None = None,
                 trajectories: Sequence[int] | None = None) -> list[Generation]:
        out = []
        for i, ids in enumerate(prompts):
            task = self._task_of(self.tokenizer.decode(ids))
            # without trajectory numbers, prompts come n per task in trajectory order (a barrier rollout)
            text = self.response(task, trajectories[i] if trajectories is not None else i % self.n)
            if self.thinking:
                text = text.replace("Okay,", self.thinking, 1)
            resp = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(list(ids), resp, text, truncated=False))
        return out


THINKING = " Let me check how each thread indexes the input and whether the loads are coalesced."


def thinking_prose(tokenizer, tokens: int) -> str:
    """``Okay,`` and then sentences of reasoning-like prose, about ``tokens`` tokens in all ("" for 0)."""
    if tokens <= 0:
        return ""
    per = len(tokenizer.encode(THINKING, add_special_tokens=False))
    return "Okay," + THINKING * max(1, round(tokens / per)) + "\nSo:"
