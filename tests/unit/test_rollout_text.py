"""Response parsing and prompt rendering."""
from __future__ import annotations

from kevin_exp.rollout.parsing import parse_response
from kevin_exp.rollout.prompts import Attempt, feedback_text, turn_prompt

REF = "class Model:\n    pass\n"


def test_last_complete_block_wins_and_summary_is_kept():
    text = "Okay, first try:\n```python\nA = 1\n```\nbetter:\n```python\nA = 2\n```\nI fused the loops.\n```python\nunfinished"
    parsed = parse_response(text)
    assert parsed.ok and parsed.code == "A = 2"
    assert parsed.summary.startswith("I fused the loops.")


def test_code_in_reasoning_is_ignored_after_think_end():
    text = "<think>draft\n```python\nA = 0\n```\n</think>\nfinal\n```python\nA = 3\n```\nsummary"
    parsed = parse_response(text)
    assert parsed.code == "A = 3" and "draft" in parsed.reasoning


def test_no_code_block_is_a_format_error():
    parsed = parse_response("Okay, I think we should use shared memory.")
    assert not parsed.ok and "code block" in parsed.error


def test_feedback_templates():
    ok = feedback_text(Attempt("x", "s", "ok", "", speedup=1.234))
    assert "1.23x" in ok and "correct but can be made faster" in ok
    assert "failed to compile" in feedback_text(Attempt("x", "", "compile_error", "error: expected ';'"))
    assert "expected ';'" in feedback_text(Attempt("x", "", "compile_error", "error: expected ';'"))
    for status in ("format_error", "compile_error", "runtime_error", "incorrect", "forbidden", "ok"):
        assert feedback_text(Attempt("x", "", status, "m", speedup=1.0)).endswith("generate new, complete code.")


def test_first_turn_has_example_later_turns_history_without_example():
    first, _ = turn_prompt(REF, "cuda", [], 10_000)
    assert "example architecture" in first and "class Model" in first
    history = [Attempt("code_one", "sum one", "incorrect", "mismatch"), Attempt("code_two", "sum two", "ok", "", 1.5)]
    later, dropped = turn_prompt(REF, "cuda", history, 10_000)
    assert dropped == 0 and "example architecture" not in later
    assert later.index("code_one") < later.index("code_two") and "sum two" in later and "1.50x" in later


def test_budget_drops_earliest_attempts_first():
    history = [Attempt(f"code_{i}" + "x" * 400, "", "incorrect", "bad") for i in range(5)]
    text, dropped = turn_prompt(REF, "cpu", history, max_tokens=400, count_tokens=len)
    assert dropped >= 1 and "code_0" not in text and "code_4" in text
