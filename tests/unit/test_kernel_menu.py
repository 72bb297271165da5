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
    assert all(p.suite == "kernel_menu" for p in MENU_TASKS) and OPTIONS == LETTERS == ("A", "B", "C", "D")
    assert PROFILE == "A"


def test_a_letter_submits_its_kernel_and_a_profile_makes_a_the_fast_one():
    task = MENU_TASKS[0]
    before = {letter: task.candidate(letter, "cpu", profiled=False) for letter in OPTIONS}
    after = {letter: task.candidate(letter, "cpu", profiled=True) for letter in OPTIONS}
    assert before[PROFILE] == task.program("probe", "cpu")  # the profile costs its turn: the probe is not correct
    assert before["B"] == task.program("slow", "cpu")
    assert before["C"] == task.program("off_by_one", "cpu") and before["D"] == task.program("broken", "cpu")
    assert after["A"] == task.program("fast", "cpu") == task.solution("cpu")
    assert {k: v for k, v in after.items() if k != "A"} == {k: v for k, v in before.items() if k != "A"}


def test_what_each_answer_submitted_follows_from_the_turns_before_it():
    kinds = MENU_TASKS[0].kinds_played
    assert kinds(["A", "A", "A"]) == ["probe", "fast", "fast"]
    assert kinds(["B", "A", "A"]) == ["slow", "probe", "fast"]
    assert kinds(["", "C", "D"]) == ["", "off_by_one", "broken"]


def test_each_kind_is_its_own_program_computing_the_references_function():
    task = MENU_TASKS[0]
    programs = {kind: task.program(kind, "cpu") for kind in KINDS}
    assert len(set(programs.values())) == len(KINDS)
    for program in programs.values():
        assert EXPRESSIONS[task.name] in program and "class ModelNew" in program
    assert "omp parallel for simd" in programs["fast"] and "'-O3', '-march=native', '-ffast-math', '-fopenmp'" in programs["fast"]
    assert "omp" not in programs["slow"] and "'-O0'" in programs["slow"] and "accessor" in programs["slow"]
    assert "o[i] = in[i];" in programs["probe"]  # a copy: the memory pass alone
    with pytest.raises(ValueError, match="cpu only"):
        task.program("fast", "cuda")


@pytest.mark.parametrize("text, letter", [
    ("C", "C"), (" C.", "C"), ("Option C", "C"), ("A (profile)", "A"), ("I think B", "B"), ("A, then B", "A"),
    ("B\n", "B"), ("(A)", "A"), ("C++ kernel B", "B"), ("A.", "A"), ("A-", "A"), ("D", "D"),
])
def test_the_first_option_letter_standing_alone_is_the_answer(text, letter):
    assert option_in(text) == letter
    answer = parse_menu_answer(text, MENU_TASKS[0], "cpu", profiled=False)
    assert answer.ok and answer.letter == letter and answer.candidate == MENU_TASKS[0].candidate(letter, "cpu", False)


@pytest.mark.parametrize("text", ["", "c", "AB", "Faster", "I would pick the fast one", "P", "E", "F", "C++", "C#",
                                  "D-value", "A.B"])
def test_an_answer_naming_no_option_is_a_format_error(text):
    answer = parse_menu_answer(text, MENU_TASKS[0], "cpu", profiled=True)
    assert not answer.ok and answer.letter == "" and "no option letter" in answer.error


def _ok(letter: str, speedup: float) -> Attempt:
    return Attempt("program", letter, "ok", "correct", speedup)


PROBED = Attempt("program", PROFILE, "incorrect", "output mismatch")


def test_the_first_prompt_says_what_the_reference_computes_and_shows_the_menu():
    task = MENU_TASKS[1]
    text = menu_prompt(task, [], "cpu")
    assert what_it_computes(task.source) in text and MENU in text and text.endswith(ASK) and "CPU" in text
    assert "import torch" not in text and "Turn" not in text and PROFILED not in text
    assert what_it_computes(task.source).startswith("A degree-4 polynomial")


def test_a_later_prompt_shows_each_turns_answer_verdict_and_speedup_and_what_a_profile_showed():
    task = MENU_TASKS[0]
    history = [_ok("B", 0.12), Attempt(None, "", "format_error", "no option letter found in the answer")]
    text = menu_prompt(task, history, "cpu")
    assert "Turn 1: you answered B. Your kernel was correct" in text and "0.12x" in text
    assert "Turn 2: your answer named no option." in text and "no option letter found" in text
    assert "Restart your reasoning" not in text and PROFILED not in text
    assert text.index("Turn 1") < text.index("Turn 2") < text.index(ASK)
    after_profile = menu_prompt(task, [PROBED], "cpu")
    assert "Turn 1: you answered A." in after_profile and PROFILED in after_profile
    # the profile's note follows the turn that took it, not every A: the second A was the fast kernel
    twice = menu_prompt(task, [PROBED, _ok("A", 4.0)], "cpu")
    assert twice.count(PROFILED) == 1 and twice.index(PROFILED) < twice.index("Turn 2")
    # with the first turn left out, the second is still the fast kernel, not a profile
    assert PROFILED not in menu_prompt(task, [PROBED, _ok("A", 4.0)], "cpu", dropped=1)
    assert not profiled([_ok("B", 0.1), _ok("C", 0.1)]) and profiled([_ok("B", 0.1), PROBED])


def test_the_moves_of_a_run_are_read_from_its_transcripts():
    from kevin_exp.tasks.kernel_menu.moves import move_shares

    task = "kernel_menu/level1/2"

    def trajectory(step: int, index: int, *answers: str) -> list[dict]:
        return [{"step": step, "task_id": task, "trajectory": index, "turn": t, "summary": a}
                for t, a in enumerate(answers, start=1)]

    rows = [
        # step 1: one profiles then submits A (fast), one answers B twice (slow), one profiles then names nothing
        *trajectory(1, 0, "A", "A"), *trajectory(1, 1, "B", "B"), *trajectory(1, 2, "A", ""),
        # step 2: no profile on turn 1; turn 2 takes it
        *trajectory(2, 0, "B", "A"),
    ]
    shares = move_shares(rows)
    assert shares[1] == {"profile_first": 2 / 3, "fast_after_profile": 1 / 2, "fast_last": 1 / 3}
    assert shares[2] == {"profile_first": 0.0, "fast_after_profile": None, "fast_last": 0.0}


@pytest.mark.parametrize("gamma, profile_wins", [(0.0, False), (0.4, True), (1.0, True)])
def test_only_a_discount_above_zero_credits_the_profile_with_what_it_leads_to(gamma, profile_wins):
    """docs/learning.md's table, through the project's own returns: the turn-1 return of the profile (the probe,
    which scores 0, then A: the fast one) against B (the slow kernel, then B again), each with turn 2 played as well
    as it can be after it."""
    from kevin_exp.rl.returns import discounted_returns
    from kevin_exp.rl.reward import turn_score

    probe, fast, slow = turn_score(False, None), turn_score(True, 2.0), turn_score(True, 0.03)
    profile = discounted_returns([probe, fast], gamma)[0]
    plain = discounted_returns([slow, slow], gamma)[0]
    assert (profile > plain) is profile_wins, (profile, plain)
    # a margin either way (the fast kernel measured 2-6x here), not a difference the noise of a timing could flip
    assert abs(profile - plain) > 0.3
