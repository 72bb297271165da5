"""trainer=deepspeed: the generated DeepSpeed config, the user file merged on top, and the settings refused
when the config is composed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kevin_exp.config import ConfigError, TrainerConfig
from kevin_exp.trainer.ds_config import generate_deepspeed_config, merged, run_deepspeed_config
from tests.helpers import compose_train

REPO = Path(__file__).resolve().parents[2]
DS = ["trainer=deepspeed"]


def test_the_config_follows_the_trainer_settings():
    cfg = generate_deepspeed_config(TrainerConfig(backend="deepspeed", zero_stage=3, offload_optimizer="cpu",
                                                  offload_params="cpu", bf16=True, grad_clip=0.5, lr=3e-6,
                                                  adam_beta1=0.8, adam_beta2=0.95, weight_decay=0.1), world_size=8)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["gradient_clipping"] == 0.5
    params = cfg["optimizer"]["params"]
    assert cfg["optimizer"]["type"] == "AdamW" and params["lr"] == 3e-6 and params["betas"] == [0.8, 0.95]
    assert params["weight_decay"] == 0.1
    # DeepSpeed accepts only its CPU Adam for offloaded optimizer states
    assert params["torch_adam"] is False
    # one micro-batch per step per rank: the learner sets the accumulation boundary itself
    assert cfg["train_batch_size"] == 8 * cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
    assert cfg["checkpoint"] == {"load_universal": False}


def test_stage_two_without_offload_uses_torch_adam_and_no_parameter_offload():
    cfg = generate_deepspeed_config(TrainerConfig(backend="deepspeed", zero_stage=2, offload_optimizer="none"), 2,
                                    load_universal=True)
    assert cfg["zero_optimization"]["stage"] == 2
    assert "offload_param" not in cfg["zero_optimization"] and "offload_optimizer" not in cfg["zero_optimization"]
    assert cfg["optimizer"]["params"]["torch_adam"] is True
    assert cfg["checkpoint"]["load_universal"] is True


def test_the_user_file_is_merged_on_top(tmp_path):
    user = tmp_path / "ds.json"
    user.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 1e7}, "gradient_clipping": 2.0,
                                "comms_logger": {"enabled": True}}))
    trainer = TrainerConfig(backend="deepspeed", zero_stage=3, deepspeed_config=str(user))
    cfg = run_deepspeed_config(trainer, 2)
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 1e7
    assert cfg["zero_optimization"]["stage"] == 3  # kept: the merge is key by key
    assert cfg["gradient_clipping"] == 2.0 and cfg["comms_logger"] == {"enabled": True}
    assert merged({"a": {"b": 1}}, {"a": 5}) == {"a": 5}


def test_trainer_deepspeed_composes_with_its_defaults():
    cfg = compose_train(DS)
    t = cfg.trainer
    assert t.backend == "deepspeed" and t.bf16
    # the layout is resolved at launch from the memory estimate (tests/unit/test_layout.py)
    assert (t.zero_stage, t.offload_optimizer, t.offload_params, t.micro_batch_tokens) == ("auto",) * 4
    assert t.dist_timeout_s >= 600  # minutes: a rank waits for the others' kernel evaluation


def test_an_unresolved_layout_never_reaches_deepspeed():
    with pytest.raises(ValueError, match="trainer.zero_stage=auto: a run resolves its layout"):
        generate_deepspeed_config(compose_train(DS).trainer, 1)


@pytest.mark.parametrize("overrides,named", [
    (["trainer.zero_stage=2", "trainer.offload_params=cpu"], "trainer.offload_params=cpu"),
    (["trainer.zero_stage=1"], "trainer.zero_stage=1: expected auto or an integer in [2, 3]"),
    (["trainer.zero_stage=best"], "trainer.zero_stage='best'"),
    (["trainer.micro_batch_tokens=0"], "trainer.micro_batch_tokens=0: expected auto or an integer >= 1"),
    (["trainer.offload_optimizer=nvme"], "trainer.offload_optimizer"),
    (["trainer.deepspeed_config=/no/such/file.json"], "trainer.deepspeed_config=/no/such/file.json"),
    (["algorithm.kl_coef=0.1"], "algorithm.kl_coef=0.1"),
])
def test_bad_deepspeed_settings_are_refused_naming_the_setting(overrides, named):
    with pytest.raises(ConfigError) as e:
        compose_train(DS + overrides)
    assert named in str(e.value)


def test_a_deepspeed_setting_under_the_torch_backend_is_refused():
    with pytest.raises(ConfigError, match="trainer.zero_stage=2: a DeepSpeed setting"):
        compose_train(["trainer.zero_stage=2"])


def test_a_user_file_that_is_not_json_is_refused(tmp_path):
    bad = tmp_path / "ds.json"
    bad.write_text("{zero: 3")
    with pytest.raises(ConfigError, match="not valid JSON"):
        compose_train(DS + [f"trainer.deepspeed_config={bad}"])


def test_tasks_that_do_not_divide_over_the_ranks_are_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"tasks_per_step=6: .* multiple of the world size \(e.g. tasks_per_step=4\)"):
        compose_train(DS + ["tasks_per_step=6"])
    with pytest.raises(ConfigError, match="trains with trainer=deepspeed"):
        compose_train(["tasks_per_step=4"])
    assert compose_train(DS + ["tasks_per_step=8"]).tasks_per_step == 8


def test_without_deepspeed_installed_a_run_is_refused_but_the_memory_planner_answers():
    # transformers looks for DeepSpeed when it loads: let it load first, then hide the package
    hide = ("import sys, importlib.abc\n"
            "import transformers, kevin_exp.models.loading, kevin_exp.config\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'deepspeed' or name.startswith('deepspeed.'): raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "from kevin_exp.config import ConfigError\n"
            "from kevin_exp.launch.memory_report import main\n"
            "from kevin_exp.launch.preflight import check_trainer_installed\n"
            "from tests.helpers import compose_train\n"
            "main(['experiment=kevin_7b', 'resources=h200x8'])\n"
            "cfg = compose_train(['trainer=deepspeed'])\n"
            "try:\n    check_trainer_installed(cfg)\nexcept ConfigError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", hide], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "layout: zero_stage=" in out.stdout and "per GPU:" in out.stdout  # the planner needs no trainer
    assert "refused: trainer.backend=deepspeed: DeepSpeed is not installed; pip install -e '.[deepspeed]'" in out.stdout
