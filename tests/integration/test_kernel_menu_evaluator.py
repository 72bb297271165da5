"""Every kernel of the menu through MenuEnv and the real cpu evaluator, in one batch: an answer's option becomes the
kernel behind it (the first the profile's probe, and the fast kernel once the trajectory took the profile), which is
compiled, checked and timed, scored, and fed back to the next turn's prompt."""
from __future__ import annotations

import dataclasses

import pytest

from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.rollout.menu_env import PROFILED, MenuEnv, ask_text, menu_text
from kevin_exp.rollout.prompts import Attempt
from kevin_exp.run.setup import score_weights
from kevin_exp.tasks.kernel_menu import load_menu, symbols
from tests.helpers import compose_train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(build_cache):
    # the evaluator exactly as experiment=learn_cpu sets it, on the session's shared compile cache
    cfg = compose_train(["experiment=learn_cpu"])
    bench = dataclasses.replace(cfg.evaluator.to_bench(), cache_dir=str(build_cache), cpus=2)
    menu_env = MenuEnv(Evaluator(bench), score_weights(cfg))
    yield menu_env
    menu_env.close()


def test_each_menu_kernel_gets_its_verdict_class_and_the_next_prompt_shows_it(env):
    tasks = load_menu([1])
    profile_taken = [Attempt("program", "A", "incorrect", "output mismatch")]
    # every option on turn 1, and turn 2's first (E) after a profile
    plays = [(task, letter, []) for task in tasks for letter in symbols(1)] + [(task, "E", profile_taken) for task in tasks]
    results = env.step([t for t, _, _ in plays], [letter for _, letter, _ in plays], [[] for _ in plays],
                       [h for _, _, h in plays])
    by = {(t.name, letter, bool(h)): r for (t, letter, h), r in zip(plays, results)}
    for task in tasks:
        profile, slow, wrong, broken = (by[task.name, letter, False] for letter in symbols(1))
        fast = by[task.name, "E", True]
        for honest in (fast, slow):
            assert honest.status == "ok" and honest.correct, honest.reason
            assert honest.score == pytest.approx(0.3 + min(honest.speedup, 10.0))
        assert fast.runtime_ms < slow.runtime_ms and fast.score > 5 * slow.score, (fast.reason, slow.reason)
        # the profile's probe (a copy of the input) and the wrong kernel are caught by the comparison: they score 0
        for bad in (profile, wrong):
            assert bad.status == "incorrect" and not bad.correct and bad.score == 0.0 and "mismatch" in bad.reason
        assert broken.status == "compile_error" and broken.score == 0.0 and "not declared" in broken.reason

        # turn 2 sees each answer's verdict and speedup; after a profile, what it showed
        after_slow = env.prompt(task, [slow.attempt], 4096, len)[0]
        assert "Turn 1: you answered B. Your kernel was correct" in after_slow and f"{slow.speedup:.2f}x" in after_slow
        assert PROFILED not in after_slow
        after_broken = env.prompt(task, [broken.attempt], 4096, len)[0]
        assert "you answered D. Your kernel failed to compile" in after_broken and "not declared" in after_broken
        after_profile = env.prompt(task, [profile.attempt], 4096, len)[0]
        assert "you answered A. Your kernel was incorrect" in after_profile and PROFILED in after_profile
    # the control without feedback: every turn's prompt is the first turn's (in the turn's letters), and a profile
    # still changes what the first option submits
    env.feedback = False
    try:
        task = tasks[0]
        blind = env.prompt(task, [by[task.name, "A", False].attempt], 4096, len)[0]
        first = env.prompt(task, [], 4096, len)[0]
        assert blind == first.replace(menu_text(1, False), menu_text(2, False)).replace(ask_text(1), ask_text(2))
        assert "Turn 1" not in blind and PROFILED not in blind
        assert env.parse(task, "E", profile_taken).code == task.program("fast", "cpu")
    finally:
        env.feedback = True


def test_an_answer_naming_no_option_is_a_format_error_that_the_evaluator_never_sees(env):
    task = load_menu([1])[0]
    [result] = env.step([task], ["The fast one, surely."], [[]])
    assert result.status == "format_error" and result.score == 0.0 and "no option found" in result.reason
    assert "your answer named no option" in env.prompt(task, [result.attempt], 4096, len)[0]
