"""The kernel menu: its tasks and deals, reading an answer into a candidate program, and the menu prompt."""
from __future__ import annotations

import itertools

import pytest

from kevin_exp.rollout.menu_env import ASK, menu_prompt, shown_order
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.tasks.kernel_menu import KINDS, LETTERS, PROBE, load_menu, parse_menu_answer
from kevin_exp.tasks.kernel_menu.answers import option_in
from kevin_exp.tasks.kernel_menu.menu import EXPRESSIONS, deal_code, forward_body

MENU = load_menu([1])


def test_every_deal_of_every_reference_is_a_task_with_its_deal_in_its_id():
    references = sorted({p.name for p in MENU})
    assert references == sorted(EXPRESSIONS)
    assert len(MENU) == len(references) * 120
    assert len({p.problem_id for p in MENU}) == len(MENU)
    for name in references:
        deals = {p.deal for p in MENU if p.name == name}
        assert deals == set(itertools.permutations(KINDS))
    p = MENU[7]
    assert p.suite == "kernel_menu" and p.problem_id == f"kernel_menu/level1/{p.number}/{deal_code(p.deal)}"


def test_a_letter_submits_the_kernel_its_deal_puts_behind_it_and_the_probe_the_slow_one():
    task = next(p for p in MENU if p.deal == ("half", "broken", "fast", "slow", "off_by_one"))
    assert task.candidate("C", "cpu") == task.program("fast", "cpu") == task.solution("cpu")
    assert task.candidate("A", "cpu") == task.program("half", "cpu")
    assert task.candidate(PROBE, "cpu") == task.program("slow", "cpu") == task.candidate("D", "cpu")
    assert task.letter_of("fast") == "C"
    # the same kind of the same reference is the same program in every deal (one build in the compile cache)
    other = next(p for p in MENU if p.name == task.name and p.deal[0] == "fast")
    assert other.candidate("A", "cpu") == task.candidate("C", "cpu")


def test_each_kind_is_its_own_program_computing_the_references_function():
    task = MENU[0]
    programs = {kind: task.program(kind, "cpu") for kind in KINDS}
    assert len(set(programs.values())) == len(KINDS)
    for program in programs.values():
        assert EXPRESSIONS[task.name] in program and "class ModelNew" in program
    assert "omp parallel for simd" in programs["fast"] and "'-O3', '-march=native', '-ffast-math', '-fopenmp'" in programs["fast"]
    assert "omp" not in programs["slow"] and "'-O0'" in programs["slow"] and "accessor" in programs["slow"]
    with pytest.raises(ValueError, match="cpu only"):
        task.program("fast", "cuda")


@pytest.mark.parametrize("text, letter", [
    ("C", "C"), (" C.", "C"), ("Option C", "C"), ("P (probe)", "P"), ("I think B", "B"), ("A, then B", "A"),
    ("E\n", "E"), ("(D)", "D"), ("C++ kernel B", "B"), ("A.", "A"), ("A-", "A"),
])
def test_the_first_option_letter_standing_alone_is_the_answer(text, letter):
    assert option_in(text) == letter
    answer = parse_menu_answer(text, MENU[0], "cpu")
    assert answer.ok and answer.letter == letter and answer.candidate == MENU[0].candidate(letter, "cpu")


@pytest.mark.parametrize("text", ["", "c", "AB", "Faster", "I would pick the fast one", "F", "Q", "C++", "C#", "P-value", "A.B"])
def test_an_answer_naming_no_option_is_a_format_error(text):
    answer = parse_menu_answer(text, MENU[0], "cpu")
    assert not answer.ok and answer.letter == "" and "no option letter" in answer.error


def _ok(letter: str, speedup: float) -> Attempt:
    return Attempt("program", letter, "ok", "correct", speedup)


def test_the_first_prompt_shows_the_reference_and_the_menu_but_not_the_order():
    task = MENU[3]
    text = menu_prompt(task, [], "cpu")
    assert forward_body(task.source) in text and text.endswith(ASK) and "CPU" in text
    assert "import torch" not in text and forward_body(task.source).startswith("y = ")
    assert "Turn" not in text and "the fast kernel is" not in text


def test_a_later_prompt_shows_each_turns_answer_verdict_and_speedup():
    task = MENU[3]
    history = [_ok("B", 0.42), Attempt(None, "", "format_error", "no option letter found in the answer")]
    text = menu_prompt(task, history, "cpu")
    assert "Turn 1: you answered B. Your kernel was correct" in text and "0.42x" in text
    assert "Turn 2: your answer named no option." in text and "no option letter found" in text
    assert "Restart your reasoning" not in text and "the fast kernel is" not in text
    assert text.index("Turn 1") < text.index("Turn 2") < text.index(ASK)


def test_a_probe_shows_the_order_of_the_menu_from_then_on():
    for task in (MENU[0], MENU[50], MENU[200]):
        text = menu_prompt(task, [_ok(PROBE, 0.1), _ok("A", 3.0)], "cpu")
        fast = LETTERS[task.deal.index("fast")]
        assert f"the fast kernel is {fast};" in text and shown_order(task) in text
        assert text.index(shown_order(task)) < text.index("Turn 2")
        broken = LETTERS[task.deal.index("broken")]
        assert f"{broken} does not build" in text


def test_the_moves_of_a_run_are_read_from_its_transcripts():
    from kevin_exp.tasks.kernel_menu.moves import deal_of, fast_letter, move_shares

    task = "kernel_menu/level1/2/hbfso"  # C is fast
    assert deal_of(task) == ("half", "broken", "fast", "slow", "off_by_one") and fast_letter(task) == "C"
    rows = [
        # step 1: one trajectory probes then reads the order, one guesses twice, one probes then guesses wrong
        *[{"step": 1, "task_id": task, "trajectory": 0, "turn": t, "summary": a} for t, a in ((1, "P"), (2, "C"))],
        *[{"step": 1, "task_id": task, "trajectory": 1, "turn": t, "summary": a} for t, a in ((1, "A"), (2, "B"))],
        *[{"step": 1, "task_id": task, "trajectory": 2, "turn": t, "summary": a} for t, a in ((1, "P"), (2, ""))],
        # step 2: no probe
        *[{"step": 2, "task_id": task, "trajectory": 0, "turn": t, "summary": a} for t, a in ((1, "C"), (2, "C"))],
    ]
    shares = move_shares(rows)
    assert shares[1] == {"probe_first": 2 / 3, "read_after_probe": 1 / 2, "fast_last": 1 / 3}
    assert shares[2] == {"probe_first": 0.0, "read_after_probe": None, "fast_last": 1.0}
    with pytest.raises(ValueError, match="not a kernel-menu task id"):
        deal_of("builtin/level1/3")


@pytest.mark.parametrize("gamma, probe_wins", [(0.0, False), (0.4, True), (1.0, True)])
def test_only_a_discount_above_zero_credits_the_probe_with_what_it_reveals(gamma, probe_wins):
    """docs/learning.md's table, through the project's own returns: the expected turn-1 return of a probe (the slow
    kernel, then the fast one it showed) against a guess (then, best play: repeat a fast one, else guess again)."""
    from kevin_exp.rl.returns import discounted_returns

    fast, slow = 0.3 + 3.0, 0.4  # the capped fast kernel; the slow kernel (speedup about 0.1)
    probe = discounted_returns([slow, fast], gamma)[0]
    outcomes = [  # (probability, turn-1 reward, expected turn-2 reward) of a guess among the five letters
        (1 / 5, fast, fast), (1 / 5, slow, fast / 4), (3 / 5, 0.0, (fast + slow) / 4)]
    guess = sum(p * discounted_returns([r1, r2], gamma)[0] for p, r1, r2 in outcomes)
    assert (probe > guess) is probe_wins, (probe, guess)
    if probe_wins:
        assert probe - guess > 0.3  # a margin, not a tie the noise of a timing could flip
