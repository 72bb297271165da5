"""One rank of a DeepSpeed learner test (run by tests/integration/test_deepspeed_*.py as real processes).

usage: python deepspeed_worker.py OUT_DIR STAGE SPLIT   (SPLIT: how many of the fixed batch's samples each
rank holds, e.g. 6 or 5,1)
Writes OUT_DIR/rank{r}.pt: the step's metrics and, on rank 0, the updated weights of the generator's model.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from kevin_exp.config import AlgorithmConfig, ModelConfig, TrainerConfig
from kevin_exp.distributed import context_from_env
from kevin_exp.models import load_policy
from kevin_exp.trainer.deepspeed_learner import DeepSpeedLearner
from kevin_exp.trainer.learner import LearnerSample


def fixed_batch() -> list[LearnerSample]:
    """Six samples of different prompt and response lengths; one has a zero advantage (not run)."""
    advantages = [1.0, -0.5, 0.0, 0.7, -1.2, 0.3]
    return [LearnerSample([1, 2, 3 + k, 9][: 2 + k % 3], [5 + k, 6, 7, 8, 11, 12][: 1 + k], a)
            for k, a in enumerate(advantages)]


def main() -> None:
    out, stage, split = Path(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    ctx = context_from_env()
    assert len(split) == ctx.world_size
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny", source="tiny"))
    trainer = TrainerConfig(backend="deepspeed", zero_stage=stage, offload_optimizer="none", bf16=False, lr=1e-2,
                            warmup_ratio=0.0, grad_clip=1.0, minibatches=2, micro_batch_tokens=12, logprob_chunk_tokens=3,
                            dist_timeout_s=60)
    learner = DeepSpeedLearner(policy.model, policy.tokenizer.pad_token_id, trainer, AlgorithmConfig(normalization="token"),
                               max_new_tokens=8, total_steps=1, device=torch.device("cpu"))
    start = sum(split[: ctx.rank])
    mine = fixed_batch()[start : start + split[ctx.rank]]
    stats = learner.train_step(__import__("kevin_exp.trainer.learner", fromlist=["TrainBatch"]).TrainBatch(mine, seed=3))
    result = {"stats": stats}
    if ctx.rank == 0:
        result["weights"] = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    torch.save(result, out / f"rank{ctx.rank}.pt")


if __name__ == "__main__":
    main()
