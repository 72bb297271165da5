"""rollout.scripted_think_tokens: scripted answers as long as a reasoning model's, with the same code in them."""
from __future__ import annotations

import pytest

from kevin_exp.config import ModelConfig
from kevin_exp.errors import UserError
from kevin_exp.models import load_tokenizer
from kevin_exp.rollout.parsing import parse_response
from kevin_exp.rollout.scripted import ScriptedGenerator
from kevin_exp.tasks import load_builtin
from tests.helpers import compose_train


def _answers(think_tokens: int) -> list:
    tokenizer = load_tokenizer(ModelConfig(name="tiny", source="tiny"))
    task = [p for p in load_builtin() if p.solution("cpu")][0]
    gen = ScriptedGenerator(tokenizer, [task], "cpu", 3, think_tokens)
    prompt = tokenizer.encode(f"Write a kernel for:\n{task.source}")
    return gen.generate([prompt] * 3, 4096, 1.0, 1.0, seed=0, trajectories=[0, 1, 2])


def test_thinking_lengthens_every_answer_by_about_its_tokens_and_keeps_its_code():
    plain, long = _answers(0), _answers(1500)
    for a, b in zip(plain, long):
        added = len(b.response_ids) - len(a.response_ids)
        assert 1450 <= added <= 1550, added
        assert b.text.startswith("Okay,") and parse_response(b.text).code == parse_response(a.text).code
    assert parse_response(long[0].text).code  # the solution's code block is still found after the prose


@pytest.mark.parametrize("overrides, message", [
    (["rollout.scripted_think_tokens=100"], "rollout.scripted_think_tokens=100: a setting of the scripted backend"),
    (["rollout.backend=scripted", "rollout.scripted_think_tokens=192"],
     "rollout.scripted_think_tokens=192: must leave room for the answer within rollout.max_new_tokens=192"),
])
def test_thinking_is_refused_where_it_cannot_apply(overrides, message):
    with pytest.raises(UserError, match=message):
        compose_train(overrides)
