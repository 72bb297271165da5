"""trainer.lr=0, the control a learning run is compared with: the loop runs every step and the weights never move."""
from __future__ import annotations

import torch

from kevin_exp.run.training import TrainingRun
from tests.helpers import compose_train


def test_a_run_at_lr_zero_trains_every_step_and_leaves_the_weights_as_they_were(tmp_path):
    cfg = compose_train(["model=tiny", "rollout.env=synthetic", "logger.progress=none", "steps=2", "trainer.lr=0",
                         "trainer.warmup_ratio=0", "rollout.max_new_tokens=8"], tmp_path)
    run = TrainingRun(cfg)
    run.setup()
    before = {k: v.detach().clone() for k, v in run.learner.model.state_dict().items()}
    history = run.fit()
    assert [m["step"] for m in history] == [1, 2] and all(m["gradient_steps"] > 0 for m in history)
    assert any(m["grad_norm"] > 0 for m in history)  # there was something to learn from
    after = run.learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
