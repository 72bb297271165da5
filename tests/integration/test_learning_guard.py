"""The whole loop learns, and a broken loop does not: experiment=learn_cpu, shortened to two steps of SmolLM2-135M
(two tasks x 4 trajectories x 2 turns) through the real evaluator, then the policy read back.

What is read is the policy's own probability of each menu answer as the first token of its response on the real
prompts, and the reward it expects there (each answer's probability times the score the evaluator gave that
answer's kernel in this session): sampled rewards of 8 trajectories over two steps are mostly noise, while the
probabilities show what the update did to the policy. The move asserted is E on turn 2 after a profile (the fast
kernel then), the answer that pays most at every discount.

- the run: E after a profile rises, and so does the expected reward of turn 2;
- the same run at ``trainer.lr=0``: the policy is exactly the one it started from;
- advantages with the wrong sign (a deliberately broken estimator): E after a profile falls."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.models.loading import chat_prompt_ids
from kevin_exp.rl import advantages
from kevin_exp.rollout.menu_env import MenuEnv, menu_prompt
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.run.setup import score_weights
from kevin_exp.run.training import TrainingRun
from kevin_exp.tasks.kernel_menu import load_menu, symbols
from tests.helpers import compose_train

pytestmark = pytest.mark.slow

SHORT = ["experiment=learn_cpu", "steps=2", "n_trajectories=4", "seed=0", "logger.progress=none"]


def run_short(tmp_path, *overrides: str) -> TrainingRun:
    run = TrainingRun(compose_train([*SHORT, *overrides], tmp_path))
    run.setup()
    run.fit()
    return run


def answer_probabilities(run: TrainingRun, history: list[Attempt]) -> dict[str, float]:
    """The policy's probability of each option of the turn after ``history`` as its response's first token, mean
    over both references."""
    model, tok = run.learner.model, run.policy.tokenizer
    options = symbols(len(history) + 1)
    ids = {o: tok.encode(o, add_special_tokens=False)[0] for o in options}
    totals = dict.fromkeys(options, 0.0)
    tasks = load_menu([1])
    model.eval()
    with torch.no_grad():
        for task in tasks:
            prompt = chat_prompt_ids(tok, menu_prompt(task, history, "cpu"), run.cfg.model.system_prompt)
            p = model(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
            for o in options:
                totals[o] += float(p[ids[o]]) / len(tasks)
    return totals


@pytest.fixture(scope="module")
def scores(build_cache) -> dict[tuple[str, bool], float]:
    """What the evaluator scores each answer of turn 2, after a profile and after none (the kernels of reference 2)."""
    cfg = compose_train(["experiment=learn_cpu"])
    bench = dataclasses.replace(cfg.evaluator.to_bench(), cache_dir=str(build_cache), cpus=2)
    env = MenuEnv(Evaluator(bench), score_weights(cfg))
    try:
        task = load_menu([1])[1]
        plays = [(o, after) for o in symbols(2) for after in (False, True)]
        slow = [Attempt("program", "B", "ok", "correct", 0.03)]
        results = env.step([task] * len(plays), [o for o, _ in plays], [[] for _ in plays],
                           [PROFILED if after else slow for _, after in plays])
        return {play: r.score for play, r in zip(plays, results)}
    finally:
        env.close()


def expected_turn2_reward(p: dict[str, float], scores: dict[tuple[str, bool], float]) -> float:
    """After a profile: E is the fast kernel, F, G and H submit what they submit without one."""
    return sum(p[o] * scores[o, True] for o in symbols(2))


PROFILED = [Attempt("program", "A", "incorrect", "output mismatch")]


def test_the_loop_learns_and_a_broken_one_does_not(tmp_path, scores, monkeypatch):
    assert scores["E", True] > 3 * scores["F", True] > 0 and scores["F", True] == pytest.approx(scores["F", False], rel=0.5)
    assert scores["E", False] == scores["G", True] == scores["H", True] == 0.0  # the probe, the wrong, the broken

    control = run_short(tmp_path / "lr0", "trainer.lr=0", "steps=1")
    before = answer_probabilities(control, PROFILED)  # lr=0: the policy it started from
    initial = TrainingRun(compose_train(SHORT, tmp_path / "initial"))
    initial.setup()
    assert answer_probabilities(initial, PROFILED) == before  # the control's weights never moved

    learned = answer_probabilities(run_short(tmp_path / "learn"), PROFILED)
    assert learned["E"] > before["E"] + 0.03, (before, learned)
    assert expected_turn2_reward(learned, scores) > expected_turn2_reward(before, scores)

    grpo = advantages.get_estimator("grpo")
    monkeypatch.setitem(advantages._REGISTRY, "grpo", lambda *a, **kw: [-x for x in grpo(*a, **kw)])
    broken = answer_probabilities(run_short(tmp_path / "wrong_sign"), PROFILED)
    assert broken["E"] < before["E"] - 0.03, (before, broken)
    assert expected_turn2_reward(broken, scores) < expected_turn2_reward(before, scores)
