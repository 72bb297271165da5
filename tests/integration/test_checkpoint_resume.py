"""Checkpoints: a resumed run trains exactly as an uninterrupted one; files hold each weight once in the
training dtype; pruning keeps the newest and the marked ones; a save cut short is never resumed from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from kevin_exp.errors import UserError
from kevin_exp.trainer.checkpoint import (
    POLICY_FILE,
    TRAINER_FILE,
    Checkpointer,
    checkpoint_step,
    find_checkpoint,
    has_full_state,
    load_policy_weights,
)

VOCAB = 96


def tiny_model(seed: int, dtype: torch.dtype = torch.float32, hidden: int = 32) -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                      tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.LlamaForCausalLM(config).to(dtype)


class Trainer:
    """A model, AdamW and a warm-up LambdaLR, trained on batches drawn from torch's global RNG (so the
    restored RNG state matters too)."""

    def __init__(self, seed: int, dtype: torch.dtype = torch.float32) -> None:
        self.model = tiny_model(seed, dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: min(1.0, (k + 1) / 4))

    def step(self) -> None:
        ids = torch.randint(0, VOCAB, (3, 10))
        loss = self.model(input_ids=ids, labels=ids).loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def unique_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def test_a_resumed_run_trains_exactly_as_an_uninterrupted_one(tmp_path):
    torch.manual_seed(1)
    straight = Trainer(seed=0)
    straight.step()
    straight.step()
    checkpointer = Checkpointer(tmp_path)
    saved = checkpointer.save(2, straight.model, straight.optimizer, straight.scheduler, {"run_id": "r"})
    straight.step()
    expected = straight.weights()

    torch.manual_seed(12345)  # a fresh process: other weights, another RNG state
    resumed = Trainer(seed=7)
    assert checkpointer.latest() == saved
    state = checkpointer.load(saved, resumed.model, resumed.optimizer, resumed.scheduler)
    assert state == {"run_id": "r", "step": 2}
    resumed.step()
    got = resumed.weights()
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    assert resumed.scheduler.state_dict() == straight.scheduler.state_dict()
    assert resumed.optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    # the tie survives the load (one tensor, not two equal ones)
    assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight


@pytest.mark.parametrize("dtype,width", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_weights_are_stored_once_in_the_training_dtype(tmp_path, dtype, width):
    run = Trainer(seed=0, dtype=dtype)
    run.step()
    path = Checkpointer(tmp_path).save(1, run.model, run.optimizer, run.scheduler)
    n = unique_params(run.model)
    header = 64 * 1024
    policy = (path / POLICY_FILE).stat().st_size
    assert width * n <= policy < width * n + header
    # AdamW's two moments, in the parameters' dtype, plus small step counts and RNG states
    trainer = (path / TRAINER_FILE).stat().st_size
    assert 2 * width * n <= trainer < 2 * width * n + header
    assert sorted(p.name for p in path.iterdir()) == [POLICY_FILE, "state.json", TRAINER_FILE]
    assert len(list(tmp_path.joinpath("checkpoints").iterdir())) == 2  # step_000001 and the latest pointer


def test_pruning_keeps_the_newest_and_the_marked_checkpoints(tmp_path):
    run = Trainer(seed=0)
    checkpointer = Checkpointer(tmp_path, keep=2, keep_every=3)
    root = tmp_path / "checkpoints"
    for step in range(1, 8):
        checkpointer.save(step, run.model, run.optimizer, run.scheduler)
        if step == 2:
            (root / "step_000002" / "keep").touch()
    kept = sorted(p.name for p in root.glob("step_*"))
    assert kept == ["step_000002", "step_000003", "step_000006", "step_000007"]
    assert (root / "latest").read_text() == "step_000007"
    assert checkpointer.latest() == root / "step_000007"


def test_policy_only_checkpoints_are_read_by_evaluation_but_never_resumed_from(tmp_path):
    """trainer.state_every: the checkpoints between hold the policy alone; a run resumes from the newest one that
    holds the trainer's state, which pruning keeps however many policy-only ones came after it."""
    run = Trainer(seed=0)
    checkpointer = Checkpointer(tmp_path)  # keep_checkpoints=1
    root = tmp_path / "checkpoints"
    checkpointer.save(2, run.model, run.optimizer, run.scheduler, {"run_id": "r"})
    for step in (3, 4):
        run.step()
        checkpointer.save(step, run.model, run.optimizer, run.scheduler, {"run_id": "r"}, full_state=False)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000004"]
    assert sorted(p.name for p in (root / "step_000004").iterdir()) == [POLICY_FILE, "state.json"]
    assert not has_full_state(root / "step_000004") and has_full_state(root / "step_000002")
    assert checkpointer.latest() == root / "step_000002"
    assert find_checkpoint(tmp_path) == root / "step_000004"  # evaluation reads the newest policy
    load_policy_weights(root / "step_000004", tiny_model(seed=3))
    with pytest.raises(UserError, match="holds the policy only"):
        checkpointer.load(root / "step_000004", run.model, run.optimizer, run.scheduler)
    checkpointer.save(5, run.model, run.optimizer, run.scheduler)
    assert [p.name for p in root.glob("step_*")] == ["step_000005"]


def test_one_checkpoint_is_kept_by_default(tmp_path):
    run = Trainer(seed=0)
    checkpointer = Checkpointer(tmp_path)
    for step in range(1, 4):
        checkpointer.save(step, run.model, run.optimizer, run.scheduler)
    assert [p.name for p in (tmp_path / "checkpoints").glob("step_*")] == ["step_000003"]


@pytest.mark.parametrize("keep,keep_every,match", [(0, 0, "keep_checkpoints=0"), (1, -1, "keep_every=-1")])
def test_bad_keep_settings_are_user_errors(tmp_path, keep, keep_every, match):
    with pytest.raises(UserError, match=match):
        Checkpointer(tmp_path, keep=keep, keep_every=keep_every)


def test_a_save_cut_short_is_ignored_and_cleared_by_the_next_save(tmp_path):
    run = Trainer(seed=0)
    checkpointer = Checkpointer(tmp_path)
    first = checkpointer.save(1, run.model, run.optimizer, run.scheduler)
    # killed while writing step 2: its folder is still the hidden tmp one, with some of its files
    partial = tmp_path / "checkpoints" / ".step_000002.tmp"
    partial.mkdir()
    (partial / POLICY_FILE).write_bytes(b"\0" * 100)
    assert checkpointer.latest() == first
    assert find_checkpoint(tmp_path) == first
    resumed = Trainer(seed=3)
    assert checkpointer.load(first, resumed.model, resumed.optimizer, resumed.scheduler)["step"] == 1
    second = checkpointer.save(2, run.model, run.optimizer, run.scheduler)
    assert not partial.exists()
    assert checkpointer.latest() == second


def test_find_checkpoint_accepts_a_run_its_checkpoints_folder_or_one_checkpoint(tmp_path):
    run = Trainer(seed=0)
    checkpointer = Checkpointer(tmp_path / "run", keep=2)
    one = checkpointer.save(4, run.model, run.optimizer, run.scheduler)
    two = checkpointer.save(5, run.model, run.optimizer, run.scheduler)
    assert find_checkpoint(tmp_path / "run") == two
    assert find_checkpoint(str(tmp_path / "run" / "checkpoints")) == two
    assert find_checkpoint(one) == one
    assert checkpoint_step(one) == 4 and checkpoint_step(two) == 5


def test_find_checkpoint_says_what_is_wrong_and_what_to_pass(tmp_path):
    with pytest.raises(UserError, match=r"checkpoint=.*nowhere: no such folder; pass a training run directory"):
        find_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"empty: neither a run directory .* nor a checkpoint folder"):
        find_checkpoint(tmp_path / "empty")
    (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="no finished checkpoint yet"):
        find_checkpoint(tmp_path / "fresh")
    old = tmp_path / "old" / "checkpoints" / "step_000000"
    old.mkdir(parents=True)
    (old / "policy.pt").write_bytes(b"")
    (old / "state.json").write_text(json.dumps({"step": 0}))
    (old.parent / "latest").write_text(old.name)
    for path in (old, tmp_path / "old"):
        with pytest.raises(UserError, match="older checkpoint format"):
            find_checkpoint(path)
    with pytest.raises(UserError, match="new run_dir"):
        Checkpointer(tmp_path / "old").latest()


def test_load_policy_weights_fills_a_model_and_rejects_another_shape(tmp_path):
    run = Trainer(seed=0)
    run.step()
    path = Checkpointer(tmp_path).save(1, run.model, run.optimizer, run.scheduler)
    model = tiny_model(seed=9)
    load_policy_weights(path, model)
    for name, value in run.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    # a bf16 model reads the fp32 checkpoint in its own dtype
    half = tiny_model(seed=9, dtype=torch.bfloat16)
    load_policy_weights(path, half)
    assert half.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(half.lm_head.weight, run.model.lm_head.weight.to(torch.bfloat16))
    with pytest.raises(UserError, match=r"do not fit this model \(.*size mismatch"):
        load_policy_weights(path, tiny_model(seed=0, hidden=16))
    with pytest.raises(UserError, match=r"step_000001: its weights do not fit model=narrow \("):
        load_policy_weights(path, tiny_model(seed=0, hidden=16), model_name="narrow")


def test_the_trainer_config_and_its_yaml_agree_on_what_is_kept():
    from omegaconf import OmegaConf

    from kevin_exp.config import TrainerConfig

    yaml = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "trainer" / "torch.yaml")
    assert yaml.keep_checkpoints == TrainerConfig().keep_checkpoints == 1
    assert yaml.keep_every == TrainerConfig().keep_every == 0
