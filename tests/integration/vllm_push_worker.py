"""One rank of the vLLM weight-push test (tests/integration/test_vllm_rollout.py starts them as real processes;
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT come from the environment, and ``tests/vllm_double``
is on PYTHONPATH, so ``import vllm`` is the test double).

usage: python vllm_push_worker.py OUT
A ZeRO-3 learner with no whole copy of the model beside an engine: the engine is created first and sleeps; each
of two rounds wakes it, pushes the learner's weights (gathered one parameter at a time), generates, sleeps, and
trains on this rank's share of a fixed batch. Writes OUT/rank{r}.pt: the engine's weights after each push, the
learner's gathered weights at that moment, the consolidated state (rank 0) and the generated tokens.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from kevin_exp.config import AlgorithmConfig, ModelConfig, RolloutConfig, TrainerConfig
from kevin_exp.launch.world import context_from_env
from kevin_exp.models import load_policy
from kevin_exp.rollout.vllm_engine import VLLMGenerator
from kevin_exp.trainer.deepspeed_learner import DeepSpeedLearner
from kevin_exp.trainer.learner import TrainBatch
from tests.integration.deepspeed_worker import fixed_batch


def main() -> None:
    out = Path(sys.argv[1])
    ctx = context_from_env()
    torch.manual_seed(0)
    model_cfg = ModelConfig(name="tiny", source="tiny")
    policy = load_policy(model_cfg)
    device = torch.device("cpu")
    rollout = RolloutConfig(backend="vllm", max_prompt_tokens=32, max_new_tokens=6)
    generator = VLLMGenerator(rollout, model_cfg, policy, ctx, run_seed=0, device=device, dist_timeout_s=60)
    trainer = TrainerConfig(backend="deepspeed", zero_stage=3, offload_optimizer="none", bf16=False, lr=1e-2,
                            warmup_ratio=0.5, grad_clip=1.0, minibatches=2, micro_batch_tokens=12,
                            logprob_chunk_tokens=3, dist_timeout_s=60)
    learner = DeepSpeedLearner(policy.model, policy.tokenizer.pad_token_id, trainer, AlgorithmConfig(),
                               max_new_tokens=8, total_steps=2, device=device, keep_generator_copy=False,
                               normalization="token")
    assert all(p.is_meta for p in policy.model.parameters()), "the whole model was not released"
    share = [3, 3] if ctx.world_size == 2 else [6]
    start = sum(share[: ctx.rank])
    results: dict = {"rounds": []}
    for round_ in range(2):
        generator.wake()
        generator.update_weights(learner.generator_weights())
        engine = {k: v.detach().clone() for k, v in generator.llm.model.named_parameters()}
        gathered = {k: v.detach().clone() for k, v in learner.generator_weights()}
        gens = generator.generate([[1, 2, 3 + ctx.rank], [4, 5]], 6, 0.9, 1.0, seed=round_ * 10 + ctx.rank)
        generator.sleep()
        results["rounds"].append({"engine": engine, "learner": gathered, "tokens": [g.response_ids for g in gens],
                                  "logprobs": [g.logprobs for g in gens]})
        learner.train_step(TrainBatch(fixed_batch(round_)[start : start + share[ctx.rank]], seed=3 + round_))
    results["consolidated"] = learner.consolidated_state()
    results["final"] = {k: v.detach().clone() for k, v in learner.generator_weights()}
    results["stats"] = generator.pop_stats()
    torch.save(results, out / f"rank{ctx.rank}.pt")


if __name__ == "__main__":
    main()
