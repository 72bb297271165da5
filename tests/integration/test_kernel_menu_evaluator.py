"""Every kernel of the menu through MenuEnv and the real cpu evaluator, in one batch: an answer's letter becomes
the kernel behind it, which is compiled, checked and timed, scored, and fed back to the next turn's prompt."""
from __future__ import annotations

import dataclasses

import pytest

from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.rollout.menu_env import MenuEnv, shown_order
from kevin_exp.run.setup import score_weights
from kevin_exp.tasks.kernel_menu import KINDS, LETTERS, PROBE, load_menu
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
    # the deal that puts the kinds behind A-E in KINDS order: fast, slow, off by one, half, broken
    tasks = [p for p in load_menu([1]) if p.deal == KINDS]
    assert len(tasks) == 2
    pairs = [(task, letter) for task in tasks for letter in (*LETTERS, PROBE)]
    results = env.step([t for t, _ in pairs], [f"{letter}" for _, letter in pairs], [[] for _ in pairs])
    by = {(t.name, letter): r for (t, letter), r in zip(pairs, results)}
    for task in tasks:
        fast, slow, off_by_one, half, broken, probe = (by[task.name, letter] for letter in (*LETTERS, PROBE))
        for honest in (fast, slow, probe):
            assert honest.status == "ok" and honest.correct, honest.reason
            assert honest.score == pytest.approx(0.3 + min(honest.speedup, 3.0))
        assert fast.runtime_ms < slow.runtime_ms and fast.speedup > slow.speedup, (fast.reason, slow.reason)
        for wrong in (off_by_one, half):
            assert wrong.status == "incorrect" and not wrong.correct and wrong.score == 0.0
            assert "mismatch" in wrong.reason
        assert broken.status == "compile_error" and broken.score == 0.0 and "not declared" in broken.reason

        # turn 2 sees each answer's verdict and speedup; a probe also shows the order of the menu
        after_fast = env.prompt(task, [fast.attempt], 4096, len)[0]
        assert "Turn 1: you answered A. Your kernel was correct" in after_fast and f"{fast.speedup:.2f}x" in after_fast
        assert "the fast kernel is" not in after_fast
        after_broken = env.prompt(task, [broken.attempt], 4096, len)[0]
        assert "you answered E. Your kernel failed to compile" in after_broken and "not declared" in after_broken
        after_probe = env.prompt(task, [probe.attempt], 4096, len)[0]
        assert "you answered P." in after_probe and shown_order(task) in after_probe
        assert "the fast kernel is A;" in after_probe
    # the control without feedback: every turn's prompt is the first turn's
    env.feedback = False
    try:
        assert env.prompt(tasks[0], [by[tasks[0].name, PROBE].attempt], 4096, len) == env.prompt(tasks[0], [], 4096, len)
    finally:
        env.feedback = True


def test_an_answer_naming_no_option_is_a_format_error_that_the_evaluator_never_sees(env):
    task = load_menu([1])[0]
    [result] = env.step([task], ["The fast one, surely."], [[]])
    assert result.status == "format_error" and result.score == 0.0 and "no option letter" in result.reason
    assert "your answer named no option" in env.prompt(task, [result.attempt], 4096, len)[0]
