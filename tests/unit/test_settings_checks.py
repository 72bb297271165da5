"""Every setting is checked when the config is composed: enumerations against what the code implements,
numbers against their ranges, cross-field rules; a setting has one name."""
from __future__ import annotations

import pytest

from kevin_exp.config import ConfigError
from tests.helpers import compose_train

BAD_CHOICES = [
    ("normalization=tokn", "normalization='tokn': expected one of constant, token, sequence"),
    ("algorithm.estimator=rloo", "algorithm.estimator='rloo': expected one of grpo, trloo"),
    ("algorithm.aggregation=mean", "algorithm.aggregation='mean': expected one of sum, max"),
    ("rollout.backend=vllm", "rollout.backend=vllm: vLLM is not installed; pip install -e '.[vllm]'"),
    ("rollout.backend=sglang", "rollout.backend='sglang': expected one of hf, scripted, vllm"),
    ("rollout.env=real", "rollout.env='real': expected one of kernel, synthetic"),
    ("evaluator.backend=tpu", "evaluator.backend='tpu': expected one of auto, cpu, cuda"),
    ("evaluator.build_mode=slow", "evaluator.build_mode='slow': expected one of fast, torch"),
    ("evaluator.timing_statistic=mean", "evaluator.timing_statistic='mean': expected one of min, median"),
    ("tasks.suite=other", "tasks.suite='other': expected one of builtin, kernelbench, kernel_menu"),
    ("tasks.split=half", "tasks.split='half': expected one of all, kevin_train, kevin_holdout"),
    ("logger.kind=csv", "logger.kind='csv': expected one of jsonl, wandb"),
    ("logger.progress=bars", "logger.progress='bars': expected one of auto, bar, lines, none"),
    ("model.dtype=float16", "model.dtype='float16': expected one of float32, bfloat16"),
    ("resume=maybe", "resume='maybe': expected one of auto, never"),
    ("trainer.device=gpu", "trainer.device='gpu': expected auto, cpu, cuda or cuda:N"),
]

BAD_NUMBERS = [
    ("gamma=1.5", "gamma=1.5: expected a number in [0, 1]"),
    ("gamma=-0.1", "gamma=-0.1: expected a number in [0, 1]"),
    ("n_turns=0", "n_turns=0: expected >= 1"),
    ("steps=-1", "steps=-1: expected >= 1"),
    ("n_trajectories=0", "n_trajectories=0: expected >= 1"),
    ("tasks_per_step=0", "tasks_per_step=0: expected >= 1"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0: expected >= 1"),
    ("rollout.max_prompt_tokens=0", "rollout.max_prompt_tokens=0: expected >= 1"),
    ("rollout.temperature=0", "rollout.temperature=0.0: expected > 0"),
    ("rollout.top_p=0", "rollout.top_p=0.0: expected a number in (0, 1]"),
    ("rollout.top_p=1.5", "rollout.top_p=1.5: expected a number in (0, 1]"),
    ("trainer.lr=-0.1", "trainer.lr=-0.1: expected >= 0"),
    ("trainer.micro_batch_size=0", "trainer.micro_batch_size=0: expected >= 1"),
    ("trainer.keep_checkpoints=0", "trainer.keep_checkpoints=0: expected >= 1"),
    ("evaluator.timed_trials=0", "evaluator.timed_trials=0: expected >= 1"),
    ("evaluator.run_cores=-2", "evaluator.run_cores=-2: expected >= -1"),
    ("eval.n_turns=0", "eval.n_turns=0: expected >= 1"),
    ("resources.max_memory_fraction=1.2", "resources.max_memory_fraction=1.2: expected a number in (0, 1]"),
    ("tasks.levels=[]", "tasks.levels=[]: expected at least one value"),
    ("tasks.levels=[1,9]", "tasks.levels=[1, 9]: 9 is not a number in [1, 4]"),
]


@pytest.mark.parametrize("override, message", BAD_CHOICES + BAD_NUMBERS, ids=[o for o, _ in BAD_CHOICES + BAD_NUMBERS])
def test_a_bad_setting_is_refused_at_composition_naming_key_value_and_what_is_allowed(override, message):
    with pytest.raises(ConfigError) as caught:
        compose_train([override])
    assert message in str(caught.value)


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="model.path=null: model.source=hf needs model.path"):
        compose_train(["model.source=hf"])
    with pytest.raises(ConfigError, match="backend=scripted answers with kernels: it needs rollout.env=kernel"):
        compose_train(["rollout.backend=scripted", "rollout.env=synthetic"])
    with pytest.raises(ConfigError, match="tasks.split=kevin_train: Kevin's splits are of KernelBench"):
        compose_train(["tasks.split=kevin_train"])


def test_remote_placement_needs_slurm(monkeypatch, tmp_path):
    import shutil

    if shutil.which("sbatch"):
        compose_train(["evaluator.placement=remote"])  # dask-jobqueue is a test dependency; SLURM is here
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without SLURM's commands
    with pytest.raises(ConfigError, match=r"evaluator.placement=remote: no SLURM here \(sbatch not found\)"):
        compose_train(["evaluator.placement=remote"])


def test_every_problem_is_named_once_in_one_error():
    with pytest.raises(ConfigError) as caught:
        compose_train(["gamma=2", "n_turns=0"])
    text = str(caught.value)
    assert "gamma=2.0" in text and "n_turns=0" in text


@pytest.mark.parametrize("old, name", [("algorithm.gamma", "gamma"), ("algorithm.normalization", "normalization"),
                                       ("evaluator.max_speedup", "algorithm.max_speedup")])
def test_a_headline_setting_has_one_name_and_its_old_one_points_at_it(old, name):
    from kevin_exp.launch.preflight import Composer

    compose_train([])  # registers the schemas and resolvers
    with pytest.raises(ConfigError, match=f"{old}: no such setting \\(did you mean {name}\\?\\)"):
        Composer("train").compose([f"{old}=0.9"])


@pytest.mark.parametrize("override, message", [
    ("evaluator.recheck_tolerance=0.5", "evaluator.recheck_tolerance=0.5: expected >= 1"),
    ("evaluator.hang_floor_s=0", "evaluator.hang_floor_s=0.0: expected > 0"),
    ("algorithm.max_speedup=-1", "algorithm.max_speedup=-1.0: expected >= 0"),
])
def test_the_timing_protocol_settings_are_checked(override, message):
    with pytest.raises(ConfigError) as caught:
        compose_train([override])
    assert message in str(caught.value)


def test_a_hang_floor_above_the_ceiling_is_refused():
    with pytest.raises(ConfigError, match="evaluator.hang_floor_s=200.0 is above evaluator.hang_ceiling_s=120.0"):
        compose_train(["evaluator.hang_floor_s=200"])


def test_a_sweep_whose_points_share_one_run_dir_is_refused_and_one_per_point_passes(tmp_path):
    from kevin_exp.launch.preflight import preflight

    compose_train([])  # registers the schemas and resolvers
    tiny = ["model=tiny", "rollout.env=synthetic", "steps=1"]
    fixed = tmp_path / "one"
    with pytest.raises(ConfigError, match=f"run_dir={fixed}: the sweep points gamma=0.0 and gamma=0.4 would both write "
                                          "their records there; leave run_dir out of a sweep"):
        preflight("train", ["-m", *tiny, "gamma=0.0,0.4", f"run_dir={fixed}"])
    assert not fixed.exists()
    points = preflight("train", ["-m", *tiny, "gamma=0.0,0.4", f"run_dir={tmp_path}/g${{gamma}}",
                                 f"hydra.sweep.dir={tmp_path}/sweep"])
    assert sorted(p.run_dir for p in points) == [f"{tmp_path}/g0.0", f"{tmp_path}/g0.4"]


def test_a_run_is_the_same_run_on_other_resources_and_launch_settings_but_not_with_other_settings():
    from kevin_exp.launch.preflight import run_identity

    launch = {"resources", "logger", "cluster", "steps"}
    assert run_identity(["resources.ranks_per_node=1", "resources.gpus_per_node=2", "resources=cpu",
                         "logger.progress=none", "steps=3", "hydra.run.dir=/x", "gamma=0.4"], launch) == ["gamma=0.4"]
    # a key that only begins like a launch key is a setting of its own
    assert run_identity(["resources_note=a", "+gamma=0.0", "trainer.lr=0"], launch) == ["gamma=0.0", "resources_note=a",
                                                                                          "trainer.lr=0"]
