"""DeepSpeed's learner over ranks (CPU, gloo, real processes): 2 ranks compute the update 1 rank computes on
the whole batch, under ZeRO-2 and ZeRO-3, with ranks holding different numbers of sequences; a sharded
checkpoint resumes on another number of ranks through DeepSpeed's universal checkpoint."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.deepspeed_ranks import run_ranks

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

# fp32 throughout; the ranks sum the same terms in another order (per-rank partial sums, then a reduction),
# which moves a float32 result by a few ulps (~1e-7 relative); an error in the normalisation or a sample
# counted twice or not at all moves the loss and grad norm by more than 1e-2 relative
REL = 1e-5
ATOL_WEIGHTS = 1e-6


def _run(tmp_path: Path, name: str, split: str, mode: str) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    world = len(split.split(","))
    run_ranks("deepspeed_worker.py", [str(out), split, str(tmp_path / "ckpt_run"), mode], world, out)
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[list[dict], list[dict], Path]:
    """2 ranks (5 sequences on rank 0, 1 on rank 1: their micro-batch counts differ, which deadlocks ZeRO-3
    unless equalised), then 1 rank on the whole batch, which also resumes the 2 ranks' checkpoint."""
    tmp = tmp_path_factory.mktemp("ds_learner")
    two = _run(tmp, "two", "5,1", "two")
    one = _run(tmp, "one", "6", "one")
    return two, one, tmp


def _assert_same_update(one: dict, two: dict) -> None:
    for key in ("loss", "grad_norm", "kl", "entropy", "clip_fraction"):
        assert two["stats"][key] == pytest.approx(one["stats"][key], rel=REL), key
    assert two["stats"]["gradient_steps"] == one["stats"]["gradient_steps"] == 2
    for name, w in one["weights"].items():
        assert torch.allclose(two["weights"][name], w, rtol=0, atol=ATOL_WEIGHTS), name


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_compute_the_update_of_one_rank_on_the_whole_batch(runs, stage):
    two, one, _ = runs
    key = f"z{stage}"
    assert two[0][key]["stats"] == two[1][key]["stats"]  # every rank reports the reduced metrics
    assert two[0][key]["stats"]["micro_batches"] < one[0][key]["stats"]["micro_batches"]
    _assert_same_update(one[0][key], two[0][key])
    # the generator's copy is whole on every rank (ZeRO-3 trains a partitioned one)
    for name, w in two[0][key]["weights"].items():
        assert torch.equal(two[1][key]["weights"][name], w), name
    initial = _initial_weights()
    moved = max(float((one[0][key]["weights"][k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-3  # the step changed the weights


def test_a_two_rank_checkpoint_resumes_on_one_rank(runs):
    two, one, _ = runs
    # the second update needs the restored Adam moments, step count and lr schedule to agree
    _assert_same_update(two[0]["z3_next"], one[0]["z3_next"])
    assert one[0]["z3_next"]["stats"]["lr"] == two[0]["z3_next"]["stats"]["lr"] == pytest.approx(1e-2)


def _initial_weights() -> dict[str, torch.Tensor]:
    from kevin_exp.config import ModelConfig
    from kevin_exp.models import load_policy

    torch.manual_seed(0)
    return {k: v.detach().clone() for k, v in load_policy(ModelConfig(name="tiny", source="tiny")).model.state_dict().items()}


@pytest.mark.parametrize("stage", [2, 3])
def test_the_consolidated_weights_load_as_a_policy_checkpoint(runs, stage):
    """policy.safetensors next to the shards: what evaluation loads (ZeRO-3: the whole model; ZeRO-2: its
    parameters are views into flat buffers)."""
    from kevin_exp.config import ModelConfig
    from kevin_exp.models import load_policy
    from kevin_exp.trainer.checkpoint import find_checkpoint, load_policy_weights

    two, _, tmp = runs
    model = load_policy(ModelConfig(name="tiny", source="tiny")).model
    load_policy_weights(find_checkpoint(tmp / "ckpt_run" / ("z2" if stage == 2 else "")), model, "tiny")
    for name, w in model.state_dict().items():
        assert torch.equal(w, two[0][f"z{stage}"]["weights"][name]), name
