"""rollout.async_steps=1: the next step's rollouts run while this step trains, sampled with the weights from before
this step's update (one policy version behind), on a tiny model with the synthetic reward."""
from __future__ import annotations

from pathlib import Path

import pytest

from kevin_exp.config import ConfigError
from kevin_exp.records.run_records import read_jsonl
from kevin_exp.run.training import TrainingRun
from tests.helpers import compose_train

# one generate() call per step: 2 tasks x 4 trajectories x 1 turn in one batch
STEPS = ["model=tiny", "rollout.env=synthetic", "logger.progress=none", "steps=3", "tasks_per_step=2", "n_trajectories=4",
         "n_turns=1", "rollout.max_new_tokens=8", "rollout.generation_batch_size=64", "trainer.lr=3e-2",
         "trainer.warmup_ratio=0"]


def fingerprint(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _recorded_run(tmp_path: Path, async_steps: int) -> tuple[list[dict], list[float], list[float]]:
    """The run's metrics, the weights each generate() call sampled with and the learner's weights before step 1
    and after each step (as fingerprints)."""
    run = TrainingRun(compose_train([*STEPS, f"rollout.async_steps={async_steps}"], tmp_path))
    run.setup()
    generating = run.generation_model if run.generation_model is not None else run.policy.model
    sampled_with, trained_to = [], [fingerprint(run.learner.model)]
    generate, train = run.generator.generate, run.learner.train_step

    def recording_generate(*args, **kwargs):
        sampled_with.append(fingerprint(generating))
        return generate(*args, **kwargs)

    def recording_train(batch):
        out = train(batch)
        trained_to.append(fingerprint(run.learner.model))
        return out

    run.generator.generate, run.learner.train_step = recording_generate, recording_train
    return run.fit(), sampled_with, trained_to


@pytest.mark.parametrize("async_steps", [0, 1])
def test_a_step_samples_with_the_weights_one_update_behind_only_when_asked(tmp_path, async_steps):
    history, sampled_with, trained_to = _recorded_run(tmp_path, async_steps)
    assert len(set(trained_to)) == 4  # the initial weights, then each step's update
    if async_steps:
        # step 1 samples with the initial weights; step 2 as well (it ran while step 1 trained); step 3 with step 1's
        assert sampled_with == [trained_to[0], trained_to[0], trained_to[1]]
        assert [m["policy_staleness"] for m in history] == [0, 1, 1]
    else:
        assert sampled_with == trained_to[:3]
        assert [m["policy_staleness"] for m in history] == [0, 0, 0]
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    # every step's rows once, in step order
    assert [r["step"] for r in read_jsonl(tmp_path / "turns.jsonl")] == [1] * 8 + [2] * 8 + [3] * 8


@pytest.mark.parametrize("overrides, words", [
    (["rollout.async_steps=2"], "rollout.async_steps=2: not implemented; rollouts run at most one step ahead"),
    (["rollout.async_steps=1", "trainer=deepspeed"], "rollout.async_steps=1: not implemented with trainer=deepspeed"),
])
def test_async_steps_beyond_what_is_built_are_refused_naming_the_field(overrides, words):
    with pytest.raises(ConfigError, match=words):
        compose_train(["model=tiny", *overrides])
