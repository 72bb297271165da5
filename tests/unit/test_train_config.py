"""The configs compose into typed objects; bad keys and values fail at composition with their name."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from kevin_exp.config import TrainConfig
from kevin_exp.config.resolvers import job_dir
from tests.helpers import CONF_DIR, compose_train

REPO = Path(__file__).resolve().parents[2]
# a KernelBench folder for configs that need one (composition checks the setting, not the folder)
KB = "tasks.kernelbench_path=/data/KernelBench"


def test_default_config_is_the_embedded_smoke_run():
    cfg = compose_train([])
    assert isinstance(cfg, TrainConfig)
    assert cfg.model.name == "smollm2_135m" and cfg.model.source == "smollm2"
    assert cfg.tasks.suite == "builtin" and cfg.evaluator.backend == "auto" and cfg.rollout.backend == "hf"
    assert (cfg.algorithm.clip_low, cfg.algorithm.clip_high, cfg.algorithm.kl_coef) == (0.2, 0.28, 0.0)
    assert cfg.trainer.grad_clip == 0.05 and cfg.trainer.lr == 2e-6 and cfg.trainer.minibatches == 2


def test_schema_defaults_are_the_embedded_default_run():
    """The dataclass defaults and conf/ (train.yaml with its default groups) describe the same run."""
    import dataclasses

    composed, defaults = compose_train([]), TrainConfig()

    def differences(a, b, prefix=""):
        out = []
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if dataclasses.is_dataclass(x):
                out += differences(x, y, f"{prefix}{f.name}.")
            elif x != y and f.name != "run_dir":
                out.append(f"{prefix}{f.name}: conf {x!r} != schema {y!r}")
        return out

    assert differences(composed, defaults) == []


def test_headline_knobs_reach_the_groups_that_use_them():
    cfg = compose_train(["gamma=1.0", "normalization=token", "n_turns=3", "model=tiny"])
    assert cfg.gamma == 1.0 and cfg.normalization == "token"
    assert not hasattr(cfg.algorithm, "gamma") and not hasattr(cfg.algorithm, "normalization")  # one home each
    assert cfg.n_turns == 3 and cfg.model.name == "tiny"


def test_trloo_estimator_is_selected_by_name():
    cfg = compose_train(["algorithm=trloo", "gamma=0.0"])
    assert cfg.algorithm.estimator == "trloo" and cfg.algorithm.scale_by_std is False and cfg.gamma == 0.0


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml")))
def test_every_model_option_composes(option):
    cfg = compose_train([f"model={option}"])
    assert cfg.model.name == option and cfg.model.params_b > 0


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF_DIR / "evaluator").glob("*.yaml")))
def test_every_evaluator_option_composes(option):
    cfg = compose_train([f"evaluator={option}"])
    assert cfg.evaluator.to_bench().backend in ("cpu", "cuda")


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_experiment_composes(experiment):
    cfg = compose_train([f"experiment={experiment}", KB])
    assert cfg.experiment == experiment


def test_an_unknown_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException, match="gama"):
        compose_train(["gama=0.4"])


def test_a_wrong_type_fails_naming_the_key():
    with pytest.raises((ConfigCompositionException, ValidationError), match="steps"):
        compose_train(["steps=many"])


def test_help_lists_the_groups_without_schema_entries():
    proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "model: 14b, 32b, 7b, qwen25_05b_random, qwen25_3b_random, smollm2_135m, tiny" in proc.stdout
    assert "_schema" not in proc.stdout


def test_job_dir_is_a_function_of_the_overrides_only():
    assert job_dir("") == "default"
    assert job_dir("gamma-0.4+n_turns-2") == "gamma-0.4+n_turns-2"
    assert job_dir("model.path-/data/qwq") == "model.path-_data_qwq"
    assert job_dir("tasks.ids-[a,b]") == "tasks.ids-_a_b_"
    long = ",".join(f"k{i}=v{i}" for i in range(60))
    assert job_dir(long) == job_dir(long) and len(job_dir(long)) <= 120 and job_dir(long) != job_dir(long + "x")


def test_the_run_directory_comes_from_the_overrides_not_the_clock():
    def run_dir(*overrides: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "kevin_exp.train", *overrides, "--cfg", "hydra", "--resolve",
                               "--package", "hydra.run"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "dir: outputs/runs/gamma-1.0+model-tiny" in run_dir("model=tiny", "gamma=1.0")
    # launch-only settings do not move the job
    assert "dir: outputs/runs/default" in run_dir("logger.progress=lines")


def test_a_kernelbench_run_without_its_folder_fails_naming_the_key(tmp_path):
    from kevin_exp.config import ConfigError
    from kevin_exp.run.setup import TaskPoolError, load_task_pool

    with pytest.raises(ConfigError, match="tasks.kernelbench_path=null: tasks=kernelbench needs"):
        compose_train(["experiment=kevin_32b"])
    with pytest.raises(TaskPoolError, match=r"tasks.kernelbench_path=.*no such folder"):
        load_task_pool(compose_train(["experiment=kevin_32b", f"tasks.kernelbench_path={tmp_path}/nope"]).tasks)


def test_the_paper_recipe_carries_the_papers_values():
    cfg = compose_train(["experiment=kevin_32b", KB])
    assert (cfg.tasks_per_step, cfg.n_trajectories, cfg.n_turns, cfg.gamma) == (8, 16, 4, 0.4)
    assert cfg.algorithm.aggregation == "sum" and cfg.normalization == "constant"
    assert cfg.trainer.grad_clip == 0.05 and cfg.rollout.temperature == 0.9 and cfg.model.path == "Qwen/QwQ-32B"
    single = compose_train(["experiment=single_turn", KB])
    assert single.n_turns == 1 and single.model.name == "32b"


@pytest.mark.parametrize("sweep", sorted(p.stem for p in (REPO / "sweeps").glob("*.yaml")))
def test_every_sweep_file_composes_and_names_itself(sweep):
    from hydra import compose, initialize_config_dir

    from kevin_exp.config import register_configs
    from kevin_exp.config.resolvers import register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"sweep={sweep}", "run_dir=unused"], return_hydra_config=True)
    assert cfg.sweep_name == sweep
    params = cfg.hydra.sweeper.params
    assert params, f"sweeps/{sweep}.yaml sweeps nothing"
    for key, values in params.items():
        # every swept value must itself compose
        for value in str(values).split(","):
            compose_train([f"{key}={value}"])


@pytest.mark.parametrize("profile", ["local", *sorted(p.stem for p in (REPO / "slurm").glob("*.yaml"))])
def test_every_cluster_profile_composes_with_the_resources_it_submits(profile):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from kevin_exp.config import register_configs
    from kevin_exp.config.resolvers import register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"cluster={profile}", "resources=h200x8", "run_dir=unused"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    if profile == "local":
        assert launcher._target_ == "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
        return
    assert launcher._target_.endswith("CheckedSlurmLauncher")
    resolved = OmegaConf.to_container(launcher, resolve=False)
    assert resolved["gpus_per_node"] == "${resources.gpus_per_node}" and cfg.resources.gpus_per_node == 8
    assert launcher.max_num_timeout > 0, "a job must be requeued on its time limit to resume"
    assert launcher.signal_delay_s >= 60


def test_the_launcher_plugin_is_discovered_by_hydra():
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    names = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Launcher)}
    assert "hydra_plugins.kevin_exp_launcher.checked_slurm.CheckedSlurmLauncher" in names


def test_state_every_must_fall_on_checkpoint_steps():
    from kevin_exp.config import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.state_every=3: expected a multiple of trainer.checkpoint_every=2"):
        compose_train(["trainer.checkpoint_every=2", "trainer.state_every=3"])
    assert compose_train(["trainer.checkpoint_every=2", "trainer.state_every=4"]).trainer.state_every == 4
