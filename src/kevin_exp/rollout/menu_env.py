"""The environment of ``tasks=kernel_menu``: a short menu prompt, and answers read as a letter of the menu.

It is ``KernelEnv`` with two parts swapped: the prompt (what the reference computes, the menu, and every earlier
turn's answer with the evaluator's verdict and speedup, plus what a profile showed) and the reading of a response
(the letter named, turned into the kernel it stands for: ``A`` builds the fast kernel once the trajectory has
taken the profile). Evaluation, scoring and the feedback text of a verdict are ``KernelEnv``'s own.
"""
from __future__ import annotations

import ast
import functools
from typing import Callable, Sequence

from kevin_exp.rollout.env import KernelEnv, ScoreWeights
from kevin_exp.rollout.parsing import ParsedResponse
from kevin_exp.rollout.prompts import RESTART, Attempt, feedback_text
from kevin_exp.tasks import Problem
from kevin_exp.tasks.kernel_menu import PROFILE, MenuProblem, parse_menu_answer

DEVICE = {"cpu": "CPU", "cuda": "GPU"}

INTRO = "Make this PyTorch program faster on the {device}: {what}"
MENU = ("P profiles the C++ kernel first: it submits the kernel as it stands, and the profile shows how to make A "
        "fast. A submits the kernel as it stands: one thread, unoptimised. B and C submit two other kernels.")
PROFILED = "The profile showed that the loop vectorises and splits over threads: A now submits that kernel."
ASK = "Answer with one letter: P, A, B or C."


@functools.lru_cache(maxsize=None)
def what_it_computes(source: str) -> str:
    """The first line of the reference ``Model``'s docstring (every token of the prompt costs a forward and a
    backward pass of the policy on a CPU: the program itself would be most of it)."""
    model = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Model")
    return (ast.get_docstring(model) or "Model").splitlines()[0].strip()


def profiled(history: Sequence[Attempt]) -> bool:
    """Whether the trajectory took the profile on an earlier turn."""
    return any(a.summary == PROFILE for a in history)


def turn_text(i: int, attempt: Attempt) -> str:
    said = f"you answered {attempt.summary}" if attempt.summary else "your answer named no option"
    verdict = feedback_text(attempt).removesuffix(RESTART).strip()
    text = f"Turn {i}: {said}. {verdict}"
    if attempt.summary == PROFILE:
        text += "\n" + PROFILED
    return text


def menu_prompt(task: MenuProblem, history: list[Attempt], backend: str) -> str:
    parts = [INTRO.format(device=DEVICE.get(backend, backend), what=what_it_computes(task.source)), MENU]
    parts += [turn_text(i + 1, a) for i, a in enumerate(history)]
    return "\n\n".join([*parts, ASK])


class MenuEnv(KernelEnv):
    """``feedback=False`` is the control in which no turn sees the earlier ones (each prompt is the first turn's);
    a profile taken still changes what ``A`` submits."""

    def __init__(self, evaluator, weights: ScoreWeights = ScoreWeights(), feedback: bool = True) -> None:
        super().__init__(evaluator, weights)
        self.feedback = feedback

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        assert isinstance(task, MenuProblem), f"{task.problem_id} is not a kernel-menu task"
        shown = history if self.feedback else []
        dropped = 0
        # the earliest turns go first when the prompt is over its budget, as in KernelEnv's prompts
        while True:
            text = menu_prompt(task, shown[dropped:], self.backend)
            if count_tokens(text) <= max_tokens or dropped >= len(shown):
                return text, dropped
            dropped += 1

    def parse(self, task: Problem, text: str, history: Sequence[Attempt] = ()) -> ParsedResponse:
        assert isinstance(task, MenuProblem), f"{task.problem_id} is not a kernel-menu task"
        answer = parse_menu_answer(text, task, self.backend, profiled(history))
        return ParsedResponse(answer.candidate, answer.letter, "", answer.error)
