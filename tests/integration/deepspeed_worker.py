"""One rank of the DeepSpeed learner tests (tests/integration/test_deepspeed_learner.py starts them as real
processes; RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT come from the environment).

usage: python deepspeed_worker.py OUT SPLIT CKPT_RUN_DIR MODE
  SPLIT: how many samples of each fixed batch every rank holds (6, or 5,1: the ranks' shares)
  Both modes run one update on batch A under ZeRO-2 (z2) and under ZeRO-3 (z3); then
  MODE two: a sharded checkpoint of the ZeRO-2 learner in CKPT_RUN_DIR/z2; one of the ZeRO-3 learner in
            CKPT_RUN_DIR, and its update on batch B (z3_next)
  MODE one: a fresh ZeRO-3 learner loads that checkpoint (converted to DeepSpeed's universal form when written
            by another number of ranks) and makes the update on batch B (z3_next)
Writes OUT/rank{r}.pt: each update's metrics and the generator model's weights after it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from kevin_exp.config import AlgorithmConfig, ModelConfig, TrainerConfig
from kevin_exp.launch.world import context_from_env
from kevin_exp.models import load_policy
from kevin_exp.trainer.checkpoint import Checkpointer, saved_world_size
from kevin_exp.trainer.deepspeed_learner import DeepSpeedLearner
from kevin_exp.trainer.learner import LearnerSample, TrainBatch


def fixed_batch(shift: int) -> list[LearnerSample]:
    """Six samples of different prompt and response lengths; one has a zero advantage (never run)."""
    advantages = [1.0, -0.5, 0.0, 0.7, -1.2, 0.3]
    return [LearnerSample([1, 2, 3 + k + shift, 9][: 2 + k % 3], [5 + k + shift, 6, 7, 8, 11, 12][: 1 + k], a)
            for k, a in enumerate(advantages[shift:] + advantages[:shift])]


def main() -> None:
    out, split, ckpt, mode = Path(sys.argv[1]), [int(x) for x in sys.argv[2].split(",")], Checkpointer(Path(sys.argv[3])), sys.argv[4]
    ctx = context_from_env()
    assert len(split) == ctx.world_size and sum(split) == 6
    start = sum(split[: ctx.rank])
    results = {}

    def learner_for(stage: int, load_universal: bool = False) -> tuple[DeepSpeedLearner, torch.nn.Module]:
        torch.manual_seed(0)
        policy = load_policy(ModelConfig(name="tiny", source="tiny"))
        trainer = TrainerConfig(backend="deepspeed", zero_stage=stage, offload_optimizer="none", bf16=False, lr=1e-2,
                                warmup_ratio=0.5, grad_clip=1.0, minibatches=2, micro_batch_tokens=12,
                                logprob_chunk_tokens=3, dist_timeout_s=60)
        learner = DeepSpeedLearner(policy.model, policy.tokenizer.pad_token_id, trainer,
                                   AlgorithmConfig(), max_new_tokens=8, total_steps=2,
                                   device=torch.device("cpu"), load_universal=load_universal, normalization="token")
        return learner, policy.model

    def update(name: str, learner: DeepSpeedLearner, model: torch.nn.Module, shift: int) -> None:
        stats = learner.train_step(TrainBatch(fixed_batch(shift)[start : start + split[ctx.rank]], seed=3 + shift))
        results[name] = {"stats": stats, "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}}

    for stage in (2, 3):
        learner, model = learner_for(stage)
        update(f"z{stage}", learner, model, 0)
        if stage == 2 and mode == "two":  # ZeRO-2's flat parameter buffers, consolidated
            Checkpointer(ckpt.root.parent / "z2").save_sharded(1, learner, {"run_id": "test"})
    if mode == "two":  # continues the ZeRO-3 learner after a checkpoint
        ckpt.save_sharded(1, learner, {"run_id": "test"})
        update("z3_next", learner, model, 1)
    else:  # a fresh learner resumed from the other world size's checkpoint
        latest = ckpt.latest()
        learner, model = learner_for(3, load_universal=saved_world_size(latest) != ctx.world_size)
        ckpt.load_sharded(latest, learner)
        update("z3_next", learner, model, 1)
    torch.save(results, out / f"rank{ctx.rank}.pt")


if __name__ == "__main__":
    main()
