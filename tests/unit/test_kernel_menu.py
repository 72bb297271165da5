"""The kernel menu: its tasks, reading an answer into a candidate program, the menu prompt, and the moves of a run."""
from __future__ import annotations

import pytest

from kevin_exp.rollout.menu_env import PROFILED, ask_text, menu_prompt, menu_text, profiled, what_it_computes
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.tasks.kernel_menu import KINDS, SYMBOLS, load_menu, option_in, parse_menu_answer, symbols
from kevin_exp.tasks.kernel_menu.menu import EXPRESSIONS

MENU_TASKS = load_menu([1])


def test_every_reference_is_one_task():
    assert sorted(p.name for p in MENU_TASKS) == sorted(EXPRESSIONS)
    assert [p.problem_id for p in MENU_TASKS] == [f"kernel_menu/level1/{p.number}" for p in MENU_TASKS]
    assert all(p.suite == "kernel_menu" for p in MENU_TASKS)
    # each turn names the options with its own symbols, in turn
    assert [symbols(t) for t in (1, 2, 3, 4)] == [("A", "B", "C", "D"), ("E", "F", "G", "H")] * 2 == list(SYMBOLS) * 2


@pytest.mark.parametrize("turn", [1, 2])
def test_an_option_submits_its_kernel_and_a_profile_makes_the_first_the_fast_one(turn):
    task = MENU_TASKS[0]
    first, second, third, fourth = symbols(turn)
    before = {o: task.candidate(o, turn, "cpu", profiled=False) for o in symbols(turn)}
    after = {o: task.candidate(o, turn, "cpu", profiled=True) for o in symbols(turn)}
    assert before[first] == task.program("probe", "cpu")  # the profile costs its turn: the probe is not correct
    assert before[second] == task.program("slow", "cpu")
    assert before[third] == task.program("off_by_one", "cpu") and before[fourth] == task.program("broken", "cpu")
    assert after[first] == task.program("fast", "cpu") == task.solution("cpu")
    assert {k: v for k, v in after.items() if k != first} == {k: v for k, v in before.items() if k != first}
    with pytest.raises(ValueError):  # another turn's symbol is no option of this one
        task.candidate(symbols(turn + 1)[0], turn, "cpu", profiled=False)


def test_what_each_answer_submitted_follows_from_the_turns_before_it():
    kinds = MENU_TASKS[0].kinds_played
    assert kinds(["A", "E", "A"]) == ["probe", "fast", "fast"]
    assert kinds(["B", "E", "A"]) == ["slow", "probe", "fast"]
    assert kinds(["", "G", "D"]) == ["", "off_by_one", "broken"]


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


@pytest.mark.parametrize("text, turn, option", [
    ("C", 1, "C"), (" C.", 1, "C"), ("Option C", 1, "C"), ("A (profile)", 1, "A"), ("I think B", 1, "B"),
    ("A, then B", 1, "A"), ("B\n", 1, "B"), ("(A)", 1, "A"), ("C++ kernel B", 1, "B"), ("A.", 1, "A"), ("A-", 1, "A"),
    ("D", 1, "D"), ("E", 2, "E"), ("F.", 2, "F"), ("A or H", 2, "H"), ("Option G", 2, "G"),
])
def test_the_first_option_of_the_turn_standing_alone_is_the_answer(text, turn, option):
    assert option_in(text, turn) == option
    answer = parse_menu_answer(text, MENU_TASKS[0], "cpu", turn, profiled=False)
    assert answer.ok and answer.letter == option
    assert answer.candidate == MENU_TASKS[0].candidate(option, turn, "cpu", False)


@pytest.mark.parametrize("text, turn", [("", 1), ("c", 1), ("AB", 1), ("Faster", 1), ("I would pick the fast one", 1),
                                        ("P", 1), ("E", 1), ("F", 1), ("C++", 1), ("C#", 1), ("D-value", 1),
                                        ("A.B", 1), ("A", 2), ("B", 2), ("E-value", 2), ("1", 2)])
def test_an_answer_naming_no_option_of_its_turn_is_a_format_error(text, turn):
    answer = parse_menu_answer(text, MENU_TASKS[0], "cpu", turn, profiled=True)
    assert not answer.ok and answer.letter == "" and "no option found" in answer.error
    assert ", ".join(symbols(turn)) in answer.error


def _ok(letter: str, speedup: float) -> Attempt:
    return Attempt("program", letter, "ok", "correct", speedup)


PROBED = Attempt("program", "A", "incorrect", "output mismatch")


def test_the_first_prompt_says_what_the_reference_computes_and_shows_the_menu():
    task = MENU_TASKS[1]
    text = menu_prompt(task, [], "cpu")
    assert what_it_computes(task.source) in text and menu_text(1, profiled=False) in text and "CPU" in text
    assert text.endswith(ask_text(1)) and ask_text(1) == "Answer with one letter: A, B, C or D."
    assert "import torch" not in text and "Turn" not in text and PROFILED not in text
    assert what_it_computes(task.source).startswith("A degree-4 polynomial")


def test_a_later_prompt_shows_each_turns_answer_verdict_and_speedup_and_what_a_profile_showed():
    task = MENU_TASKS[0]
    history = [_ok("B", 0.12), Attempt(None, "", "format_error", "no option letter found in the answer")]
    text = menu_prompt(task, history, "cpu")
    assert "Turn 1: you answered B. Your kernel was correct" in text and "0.12x" in text
    assert "Turn 2: your answer named no option." in text and "no option letter found" in text
    assert "Restart your reasoning" not in text and PROFILED not in text
    # turn 3 names its options as turn 1 does
    assert text.index("Turn 1") < text.index("Turn 2") < text.index(ask_text(3)) and ask_text(3) == ask_text(1)
    after_profile = menu_prompt(task, [PROBED], "cpu")
    assert "Turn 1: you answered A." in after_profile and PROFILED in after_profile
    # turn 2's menu, in its own letters, says what the first option submits now
    assert menu_text(2, profiled=True) in after_profile and after_profile.endswith(ask_text(2))
    assert menu_text(2, profiled=True).startswith("E submits the fast kernel the profile found")
    assert menu_prompt(task, [_ok("B", 0.03)], "cpu").count(menu_text(2, profiled=False)) == 1
    # the profile's note follows the turn that took it, not every first option: turn 2's was the fast kernel
    twice = menu_prompt(task, [PROBED, _ok("E", 4.0)], "cpu")
    assert twice.count(PROFILED) == 1 and twice.index(PROFILED) < twice.index("Turn 2")
    # with the first turn left out, the second is still the fast kernel, not a profile
    assert PROFILED not in menu_prompt(task, [PROBED, _ok("E", 4.0)], "cpu", dropped=1)
    assert not profiled([_ok("B", 0.1), _ok("G", 0.1)]) and profiled([_ok("B", 0.1), Attempt("p", "E", "incorrect", "")])


def test_the_moves_of_a_run_are_read_from_its_transcripts():
    from kevin_exp.tasks.kernel_menu.moves import move_shares

    task = "kernel_menu/level1/2"

    def trajectory(step: int, index: int, *answers: str) -> list[dict]:
        return [{"step": step, "task_id": task, "trajectory": index, "turn": t, "summary": a}
                for t, a in enumerate(answers, start=1)]

    rows = [
        # step 1: one profiles then submits the fast kernel, one the slow one twice, one profiles then names nothing
        *trajectory(1, 0, "A", "E"), *trajectory(1, 1, "B", "F"), *trajectory(1, 2, "A", ""),
        # step 2: no profile on turn 1; turn 2 takes it
        *trajectory(2, 0, "B", "E"),
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
