"""The environment of ``tasks=kernel_menu``: a short menu prompt, and answers read as an option of the menu.

It is ``KernelEnv`` with two parts swapped: the prompt (what the reference computes, the turn's menu, and every
earlier turn's answer with the evaluator's verdict and speedup, plus what a profile showed) and the reading of a
response (the option named, turned into the kernel it stands for: the first option takes the profile, and builds
the fast kernel once the trajectory has taken it). Evaluation, scoring and the feedback text of a verdict are
``KernelEnv``'s own.
"""
from __future__ import annotations

import ast
import functools
from typing import Callable, Sequence

from kevin_exp.rollout.env import KernelEnv, ScoreWeights
from kevin_exp.rollout.parsing import ParsedResponse
from kevin_exp.rollout.prompts import RESTART, Attempt, feedback_text
from kevin_exp.tasks import Problem
from kevin_exp.tasks.kernel_menu import MenuProblem, parse_menu_answer, symbols

DEVICE = {"cpu": "CPU", "cuda": "GPU"}

INTRO = "Make this PyTorch program faster on the {device}: {what}"
FIRST = {False: ("{0} profiles the C++ kernel first: it submits a probe that only copies its input (it computes "
                 "nothing, so it is not correct), and the profile shows how to make the kernel fast."),
         True: "{0} submits the fast kernel the profile found: one fused pass, vectorised and split over threads."}
REST = "{1} submits the kernel as it stands: one thread, unoptimised. {2} and {3} submit two other kernels."
PROFILED = ("The profile showed that the loop is memory-bound: fused into one pass, vectorised and split over threads, "
            "it runs near the copy's speed.")
ASK = "Answer with one letter: {0}, {1}, {2} or {3}."


def menu_text(turn: int, profiled: bool) -> str:
    """The menu of ``turn`` (its own option names), before or after a profile was taken."""
    return (FIRST[profiled] + " " + REST).format(*symbols(turn))


def ask_text(turn: int) -> str:
    return ASK.format(*symbols(turn))


@functools.lru_cache(maxsize=None)
def what_it_computes(source: str) -> str:
    """The first line of the reference ``Model``'s docstring (every token of the prompt costs a forward and a
    backward pass of the policy on a CPU: the program itself would be most of it)."""
    model = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Model")
    return (ast.get_docstring(model) or "Model").splitlines()[0].strip()


def played(history: Sequence[Attempt]) -> list[str]:
    """The kind of kernel each earlier turn submitted ("probe": that turn took the profile)."""
    return MenuProblem.kinds_played([a.summary for a in history])


def profiled(history: Sequence[Attempt]) -> bool:
    """Whether the trajectory took the profile on an earlier turn."""
    return "probe" in played(history)


def turn_text(i: int, attempt: Attempt, kind: str) -> str:
    said = f"you answered {attempt.summary}" if attempt.summary else "your answer named no option"
    verdict = feedback_text(attempt).removesuffix(RESTART).strip()
    text = f"Turn {i}: {said}. {verdict}"
    if kind == "probe":
        text += "\n" + PROFILED
    return text


def menu_prompt(task: MenuProblem, history: list[Attempt], backend: str, dropped: int = 0) -> str:
    """The prompt of the turn after ``history``. ``dropped``: how many of the earliest turns are left out (what
    each turn submitted, and so the menu, still follow from all of them)."""
    turn, kinds = len(history) + 1, played(history)
    turns = [turn_text(i + 1, a, kind) for i, (a, kind) in list(enumerate(zip(history, kinds)))[dropped:]]
    return _prompt(task, backend, turn, "probe" in kinds, turns)


def _prompt(task: MenuProblem, backend: str, turn: int, profiled: bool, turns: list[str]) -> str:
    intro = INTRO.format(device=DEVICE.get(backend, backend), what=what_it_computes(task.source))
    return "\n\n".join([intro, menu_text(turn, profiled), *turns, ask_text(turn)])


class MenuEnv(KernelEnv):
    """``feedback=False`` is the control in which no turn sees the earlier ones: each prompt is the first turn's in
    the turn's own option names, and a profile taken still changes what the first option submits."""

    def __init__(self, evaluator, weights: ScoreWeights = ScoreWeights(), feedback: bool = True) -> None:
        super().__init__(evaluator, weights)
        self.feedback = feedback

    def prompt(self, task: Problem, history: list[Attempt], max_tokens: int, count_tokens: Callable[[str], int]) -> tuple[str, int]:
        assert isinstance(task, MenuProblem), f"{task.problem_id} is not a kernel-menu task"
        if not self.feedback:
            return _prompt(task, self.backend, len(history) + 1, profiled=False, turns=[]), 0
        shown = history
        dropped = 0
        # the earliest turns go first when the prompt is over its budget, as in KernelEnv's prompts
        while True:
            text = menu_prompt(task, shown, self.backend, dropped)
            if count_tokens(text) <= max_tokens or dropped >= len(shown):
                return text, dropped
            dropped += 1

    def parse(self, task: Problem, text: str, history: Sequence[Attempt] = ()) -> ParsedResponse:
        assert isinstance(task, MenuProblem), f"{task.problem_id} is not a kernel-menu task"
        answer = parse_menu_answer(text, task, self.backend, len(history) + 1, profiled(history))
        return ParsedResponse(answer.candidate, answer.letter, "", answer.error)
