"""The kernel menu: its tasks, reading an answer into a candidate program, the menu prompt, and the moves of a run."""
from __future__ import annotations

import pytest

from kevin_exp.rollout.menu_env import ASK, MENU, PROFILED, menu_prompt, profiled, what_it_computes
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.tasks.kernel_menu import KINDS, LETTERS, OPTIONS, PROFILE, load_menu, parse_menu_answer
from kevin_exp.tasks.kernel_menu.answers import option_in
from kevin_exp.tasks.kernel_menu.menu import EXPRESSIONS

MENU_TASKS = load_menu([1])


def test_every_reference_is_one_task():
    assert sorted(p.name for p in MENU_TASKS) == sorted(EXPRESSIONS)
    assert [p.problem_id for p in MENU_TASKS] == [f"kernel_menu/level1/{p.number}" for p in MENU_TASKS]
    assert all(p.suite == "kernel_menu" for p in MENU_TASKS) and OPTIONS == (*LETTERS, PROFILE) == ("A", "B", "C", "P")


def test_a_letter_submits_its_kernel_and_a_profile_makes_a_the_fast_one():
    task = MENU_TASKS[0]
    before = {letter: task.candidate(letter, "cpu", profiled=False) for letter in OPTIONS}
    after = {letter: task.candidate(letter, "cpu", profiled=True) for letter in OPTIONS}
    assert before["A"] == before[PROFILE] == task.program("slow", "cpu")  # the profile is worth what A is
    assert before["B"] == task.program("off_by_one", "cpu") and before["C"] == task.program("broken", "cpu")
    assert after["A"] == task.program("fast", "cpu") == task.solution("cpu")
    assert {k: v for k, v in after.items() if k != "A"} == {k: v for k, v in before.items() if k != "A"}


def test_each_kind_is_its_own_program_computing_the_references_function():
    task = MENU_TASKS[0]
    programs = {kind: task.program(kind, "cpu") for kind in KINDS}
    assert len(set(programs.values())) == len(KINDS)
    for program in programs.values():
        assert EXPRESSIONS[task.name] in program and "class ModelNew" in program
    assert "omp parallel for simd" in programs["fast"] and "'-O3', '-march=native', '-ffast-math', '-fopenmp'" in programs["fast"]
    assert "omp" not in programs["slow"] and "'-O0'" in programs["slow"] and "accessor" in programs["slow"]
    with pytest.raises(ValueError, match="cpu only"):
        task.program("fast", "cuda")


@pytest.mark.parametrize("text, letter", [
    ("C", "C"), (" C.", "C"), ("Option C", "C"), ("P (profile)", "P"), ("I think B", "B"), ("A, then B", "A"),
    ("B\n", "B"), ("(A)", "A"), ("C++ kernel B", "B"), ("A.", "A"), ("A-", "A"),
])
def test_the_first_option_letter_standing_alone_is_the_answer(text, letter):
    assert option_in(text) == letter
    answer = parse_menu_answer(text, MENU_TASKS[0], "cpu", profiled=False)
    assert answer.ok and answer.letter == letter and answer.candidate == MENU_TASKS[0].candidate(letter, "cpu", False)


@pytest.mark.parametrize("text", ["", "c", "AB", "Faster", "I would pick the fast one", "D", "E", "F", "C++", "C#",
                                  "P-value", "A.B"])
def test_an_answer_naming_no_option_is_a_format_error(text):
    answer = parse_menu_answer(text, MENU_TASKS[0], "cpu", profiled=True)
    assert not answer.ok and answer.letter == "" and "no option letter" in answer.error


def _ok(letter: str, speedup: float) -> Attempt:
    return Attempt("program", letter, "ok", "correct", speedup)


def test_the_first_prompt_says_what_the_reference_computes_and_shows_the_menu():
    task = MENU_TASKS[1]
    text = menu_prompt(task, [], "cpu")
    assert what_it_computes(task.source) in text and MENU in text and text.endswith(ASK) and "CPU" in text
    assert "import torch" not in text and "Turn" not in text and PROFILED not in text
    assert what_it_computes(task.source).startswith("A degree-4 polynomial")


def test_a_later_prompt_shows_each_turns_answer_verdict_and_speedup_and_what_a_profile_showed():
    task = MENU_TASKS[0]
    history = [_ok("A", 0.12), Attempt(None, "", "format_error", "no option letter found in the answer")]
    text = menu_prompt(task, history, "cpu")
    assert "Turn 1: you answered A. Your kernel was correct" in text and "0.12x" in text
    assert "Turn 2: your answer named no option." in text and "no option letter found" in text
    assert "Restart your reasoning" not in text and PROFILED not in text
    assert text.index("Turn 1") < text.index("Turn 2") < text.index(ASK)
    after_profile = menu_prompt(task, [_ok(PROFILE, 0.11)], "cpu")
    assert "Turn 1: you answered P." in after_profile and PROFILED in after_profile
    assert not profiled([_ok("A", 0.1), _ok("B", 0.1)]) and profiled([_ok("A", 0.1), _ok(PROFILE, 0.1)])


def test_the_moves_of_a_run_are_read_from_its_transcripts():
    from kevin_exp.tasks.kernel_menu.moves import move_shares

    task = "kernel_menu/level1/2"

    def trajectory(step: int, index: int, *answers: str) -> list[dict]:
        return [{"step": step, "task_id": task, "trajectory": index, "turn": t, "summary": a}
                for t, a in enumerate(answers, start=1)]

    rows = [
        # step 1: one profiles then submits A (fast), one answers A twice (slow), one profiles then names nothing
        *trajectory(1, 0, "P", "A"), *trajectory(1, 1, "A", "A"), *trajectory(1, 2, "P", ""),
        # step 2: no profile
        *trajectory(2, 0, "B", "A"),
    ]
    shares = move_shares(rows)
    assert shares[1] == {"profile_first": 2 / 3, "fast_after_profile": 1 / 2, "fast_last": 1 / 3}
    assert shares[2] == {"profile_first": 0.0, "fast_after_profile": None, "fast_last": 0.0}


@pytest.mark.parametrize("gamma, profile_wins", [(0.0, False), (0.4, True), (1.0, True)])
def test_only_a_discount_above_zero_credits_the_profile_with_what_it_leads_to(gamma, profile_wins):
    """docs/learning.md's table, through the project's own returns: the turn-1 return of the profile (the slow
    kernel, then A: the fast one) against A (the slow kernel, then A again: the slow one), each with turn 2 played
    as well as it can be after it."""
    from kevin_exp.rl.returns import discounted_returns

    fast, slow = 0.3 + 10.0, 0.3 + 0.1  # the capped fast kernel; the slow kernel (speedup about 0.1)
    profile = discounted_returns([slow, fast], gamma)[0]
    plain = discounted_returns([slow, slow], gamma)[0]
    assert (profile > plain) is profile_wins, (profile, plain)
    if profile_wins:
        assert profile - plain > 3.0  # a margin, not a difference the noise of a timing could flip
