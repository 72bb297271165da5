"""Shared test helpers: composing the real configs, and a scripted policy for evaluator-backed steps."""
from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir

from kevin_exp.config import TrainConfig, register_configs, to_typed
from kevin_exp.hydra_resolvers import register_resolvers
from kevin_exp.rollout.generation import Generation
from kevin_exp.tasks import Problem

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose_train(overrides: list[str], run_dir: Path | None = None) -> TrainConfig:
    """The typed config `python -m kevin_exp.train <overrides>` would run with."""
    register_configs()
    register_resolvers()
    extra = [f"run_dir={run_dir}"] if run_dir is not None else ["run_dir=unused"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        return to_typed(compose(config_name="train", overrides=[*overrides, *extra]))


CODE_FENCE = "`" * 3


class ScriptedGenerator:
    """Stands in for the sampler where a random model cannot write kernels.

    Trajectory 0 of each task answers with the task's reference solution, trajectory 1 with the same code
    broken so it does not compile, the rest with prose and no code block. Everything downstream (evaluator,
    credit, learner, records) is real."""

    def __init__(self, tokenizer, tasks: list[Problem], backend: str, n_trajectories: int) -> None:
        self.tokenizer, self.tasks, self.backend, self.n = tokenizer, tasks, backend, n_trajectories

    def _task_of(self, prompt: str) -> Problem:
        hits = [t for t in self.tasks if t.source.strip() in prompt]
        assert len(hits) == 1, f"prompt matches {len(hits)} tasks"
        return hits[0]

    def response(self, task: Problem, trajectory: int) -> str:
        if trajectory == 0:
            code = task.solution(self.backend)
            return f"Okay, a direct kernel.\n{CODE_FENCE}python\n{code}\n{CODE_FENCE}\nSummary: one fused loop."
        if trajectory == 1:
            # the real solution with a C++ syntax error after its first #include
            code = re.sub(r"(#include[^\n]*\n)", r"\1int broken( {\n", task.solution(self.backend), count=1)
            return f"Okay, try this.\n{CODE_FENCE}python\n{code}\n{CODE_FENCE}\nSummary: broken."
        return "Okay, I am still thinking about the memory layout."

    def generate(self, prompts, max_new_tokens, temperature, top_p, seed):
        out = []
        for i, ids in enumerate(prompts):
            task = self._task_of(self.tokenizer.decode(ids))
            text = self.response(task, i % self.n)
            resp = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(list(ids), resp, text, truncated=False))
        return out
