"""tasks=kernel_menu and experiment=learn_cpu compose from the real configs; what they cannot run fails there."""
from __future__ import annotations

import pytest

from kevin_exp.config import ConfigError
from kevin_exp.run.setup import load_task_pool
from kevin_exp.tasks.kernel_menu import MenuProblem
from tests.helpers import compose_train


def test_learn_cpu_is_smollm2_on_the_kernel_menu_on_the_cpu_backend():
    cfg = compose_train(["experiment=learn_cpu"])
    assert cfg.experiment == "learn_cpu" and cfg.model.name == "smollm2_135m" and cfg.rollout.backend == "hf"
    assert cfg.tasks.suite == "kernel_menu" and cfg.tasks.menu_feedback and cfg.evaluator.backend == "cpu"
    assert cfg.n_turns == 2 and cfg.gamma == 0.4 and cfg.rollout.max_new_tokens <= 8
    pool = load_task_pool(cfg.tasks)
    assert len(pool) == 2 and all(isinstance(p, MenuProblem) for p in pool)
    assert cfg.tasks_per_step == len(pool) and cfg.algorithm.max_speedup == 10.0 and cfg.model.system_prompt == ""


def test_the_gamma_sweep_and_the_controls_compose():
    for gamma in (0.0, 0.4, 1.0):
        assert compose_train(["experiment=learn_cpu", f"gamma={gamma}"]).gamma == gamma
    assert compose_train(["experiment=learn_cpu", "trainer.lr=0"]).trainer.lr == 0.0
    assert compose_train(["experiment=learn_cpu", "tasks.menu_feedback=false"]).tasks.menu_feedback is False
    with pytest.raises(ConfigError, match="trainer.lr=-1"):
        compose_train(["experiment=learn_cpu", "trainer.lr=-1"])


@pytest.mark.parametrize("overrides, words", [
    (["tasks=kernel_menu", "evaluator.backend=cuda"], "evaluator.backend=cuda: tasks=kernel_menu has C\\+\\+ kernels for the cpu"),
    (["tasks=kernel_menu", "evaluator.backend=auto"], "set evaluator.backend=cpu"),
    (["experiment=learn_cpu", "rollout.backend=scripted"], "rollout.backend=scripted answers with whole programs"),
    (["experiment=learn_cpu", "tasks.levels=[2]"], r"tasks.levels=\[2\]: the kernel menu has levels \[1\] only"),
    (["experiment=learn_cpu", "tasks.split=kevin_train"], "tasks.split=kevin_train: Kevin's splits are of KernelBench"),
    (["tasks.menu_feedback=false"], "tasks.menu_feedback=false: a setting of tasks=kernel_menu"),
])
def test_what_the_kernel_menu_cannot_run_fails_at_composition_naming_the_key(overrides, words):
    with pytest.raises(ConfigError, match=words):
        compose_train(overrides)
