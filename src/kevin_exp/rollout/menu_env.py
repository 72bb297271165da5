"""The environment of ``tasks=kernel_menu``: a short menu prompt, and answers read as a letter of the menu.

It is ``KernelEnv`` with two parts swapped: the prompt (the reference's forward pass, the menu, and every earlier turn's
answer with the evaluator's verdict and speedup, plus the order of the menu once a probe has shown it) and the
reading of a response (the letter named, turned into the kernel it stands for). Evaluation, scoring and the
feedback text of a verdict are ``KernelEnv``'s own.
"""
from __future__ import annotations

from typing import Callable

from kevin_exp.rollout.env import KernelEnv, ScoreWeights
from kevin_exp.rollout.parsing import ParsedResponse
from kevin_exp.rollout.prompts import RESTART, Attempt, feedback_text
from kevin_exp.tasks import Problem
from kevin_exp.tasks.kernel_menu import LETTERS, PROBE, MenuProblem, parse_menu_answer
from kevin_exp.tasks.kernel_menu.answers import OPTIONS
from kevin_exp.tasks.kernel_menu.menu import forward_body

DEVICE = {"cpu": "CPU", "cuda": "GPU"}

INTRO = "Make this PyTorch forward pass faster on the {device}:"
MENU = ("C++ kernels A, B, C, D and E compute it: one is fast, one is slow, two are wrong, one does not build, in an "
        "order you are not told. P submits the slow kernel and shows you the order.")
ASK = "Answer with one letter: " + ", ".join(OPTIONS[:-1]) + " or " + OPTIONS[-1] + "."

# how the order of the menu reads once a probe has shown it
SHOWN = {"slow": "{} is slow", "off_by_one": "{} is wrong", "half": "{} is wrong", "broken": "{} does not build"}


def shown_order(task: MenuProblem) -> str:
    others = "; ".join(SHOWN[kind].format(letter) for letter, kind in zip(LETTERS, task.deal) if kind != "fast")
    return f"The probe showed the order: the fast kernel is {task.letter_of('fast')}; {others}."


def turn_text(i: int, attempt: Attempt, task: MenuProblem) -> str:
    said = f"you answered {attempt.summary}" if attempt.summary else "your answer named no option"
    verdict = feedback_text(attempt).removesuffix(RESTART).strip()
    text = f"Turn {i}: {said}. {verdict}"
    if attempt.summary == PROBE:
        text += "\n" + shown_order(task)
    return text


def menu_prompt(task: MenuProblem, history: list[Attempt], backend: str) -> str:
    # the reference's forward pass, not the whole program: every token of the prompt costs a forward and a backward
    # pass of the policy on a CPU, and the rest of the program (imports, sizes, inputs) is the same for every task
    parts = [INTRO.format(device=DEVICE.get(backend, backend)) + "\n" + forward_body(task.source), MENU]
    parts += [turn_text(i + 1, a, task) for i, a in enumerate(history)]
    return "\n\n".join([*parts, ASK])


class MenuEnv(KernelEnv):
    """``feedback=False`` is the control in which no turn sees the earlier ones (each prompt is the first turn's)."""

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

    def parse(self, task: Problem, text: str) -> ParsedResponse:
        assert isinstance(task, MenuProblem), f"{task.problem_id} is not a kernel-menu task"
        answer = parse_menu_answer(text, task, self.backend)
        return ParsedResponse(answer.candidate, answer.letter, "", answer.error)
