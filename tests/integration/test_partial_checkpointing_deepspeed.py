"""trainer.checkpoint_layers in DeepSpeed's learner (CPU, gloo, a real process): the ZeRO-3 module it trains has
checkpointing on the chosen layers only, and its update equals full checkpointing's."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.models.partial_checkpointing import checkpointed_layer_indices
from tests.integration.deepspeed_ranks import run_ranks

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow


def test_half_the_layers_checkpointed_give_the_same_update(tmp_path):
    run_ranks("partial_checkpointing_worker.py", [str(tmp_path)], 1, tmp_path)
    results = torch.load(tmp_path / "rank0.pt")
    full, half = results[1.0], results[0.5]
    assert all(full["flags"]) and len(full["flags"]) >= 2
    assert [i for i, on in enumerate(half["flags"]) if on] == checkpointed_layer_indices(len(half["flags"]), 0.5)
    for key in ("loss", "grad_norm"):
        assert half["stats"][key] == pytest.approx(full["stats"][key], rel=1e-6), key
    assert full["stats"]["grad_norm"] > 0
    for name, w in full["weights"].items():
        assert torch.allclose(half["weights"][name], w, rtol=0, atol=1e-7), name
