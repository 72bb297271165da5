"""One rank of tests/integration/test_partial_checkpointing_deepspeed.py: a ZeRO-3 DeepSpeedLearner's update with
activation checkpointing on all decoder layers and on half of them.

usage: python partial_checkpointing_worker.py OUT
Writes OUT/rank{r}.pt: for each share, the trained module's checkpointed layers, the update's metrics and the
generator model's weights after it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from kevin_exp.config import AlgorithmConfig, ModelConfig, TrainerConfig
from kevin_exp.launch.world import context_from_env
from kevin_exp.models import load_policy
from kevin_exp.models.partial_checkpointing import checkpointing_layers
from kevin_exp.trainer.deepspeed_learner import DeepSpeedLearner
from kevin_exp.trainer.learner import TrainBatch
from tests.integration.deepspeed_worker import fixed_batch


def main() -> None:
    out = Path(sys.argv[1])
    results = {}
    for share in (1.0, 0.5):
        torch.manual_seed(0)
        policy = load_policy(ModelConfig(name="tiny", source="tiny"))
        trainer = TrainerConfig(backend="deepspeed", zero_stage=3, offload_optimizer="none", bf16=False, lr=1e-2,
                                grad_clip=1.0, minibatches=1, micro_batch_tokens=12, logprob_chunk_tokens=3,
                                activation_checkpointing=True, checkpoint_layers=share, dist_timeout_s=60)
        learner = DeepSpeedLearner(policy.model, policy.tokenizer.pad_token_id, trainer,
                                   AlgorithmConfig(), max_new_tokens=8, total_steps=1,
                                   device=torch.device("cpu"), normalization="token")
        flags = [layer.gradient_checkpointing for layer in checkpointing_layers(learner.engine.module)]
        stats = learner.train_step(TrainBatch(fixed_batch(0), seed=3))
        results[share] = {"flags": flags, "stats": stats,
                          "weights": {k: v.detach().clone() for k, v in policy.model.state_dict().items()}}
    torch.save(results, out / f"rank{context_from_env().rank}.pt")


if __name__ == "__main__":
    main()
