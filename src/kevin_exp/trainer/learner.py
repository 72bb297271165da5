"""The policy update of one step: old log-probs, then clipped-surrogate gradient steps over mini-batches.

Each turn is its own sample (prompt = task + history, response = this turn's output); prompt tokens
carry no loss. The rollout batch is split into ``minibatches`` gradient steps (Kevin: 2, the first
on-policy, the second off-policy against the stored old log-probs), each accumulated over micro-batches.
"""
from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from kevin_exp.config import AlgorithmConfig, TrainerConfig
from kevin_exp.rl.loss import clipped_policy_loss
from kevin_exp.trainer.logprobs import pack, response_logprobs


@dataclass
class UpdateStats:
    loss: float = 0.0
    grad_norm: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_fraction: float = 0.0
    lr: float = 0.0
    gradient_steps: int = 0


@dataclass
class LearnerSample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float


class Learner:
    def __init__(self, model: torch.nn.Module, pad_id: int, trainer: TrainerConfig, algorithm: AlgorithmConfig,
                 max_new_tokens: int, total_steps: int, device: torch.device, temperature: float = 1.0) -> None:
        self.model, self.pad_id, self.cfg, self.algo = model, pad_id, trainer, algorithm
        self.max_new_tokens, self.device, self.temperature = max_new_tokens, device, temperature
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=trainer.lr, weight_decay=trainer.weight_decay,
            betas=(trainer.adam_beta1, trainer.adam_beta2),
        )
        warmup = max(0, math.ceil(trainer.warmup_ratio * total_steps * trainer.minibatches * trainer.epochs))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda k: min(1.0, (k + 1) / (warmup + 1)))
        # a frozen reference policy costs a model's memory: only keep one when the KL term is on
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if algorithm.kl_coef > 0 else None

    def _logprobs(self, model: torch.nn.Module, samples: Sequence[LearnerSample]) -> list[torch.Tensor]:
        out = []
        with torch.no_grad():
            for i in range(0, len(samples), self.cfg.micro_batch_size):
                micro = samples[i : i + self.cfg.micro_batch_size]
                batch = pack([s.prompt_ids for s in micro], [s.response_ids for s in micro], self.pad_id, self.device)
                logp, _ = response_logprobs(model, batch, temperature=self.temperature)
                out.extend(row[batch.mask[k].bool()].cpu() for k, row in enumerate(logp))
        return out

    def update(self, samples: Sequence[LearnerSample], seed: int) -> UpdateStats:
        """Gradient steps on one rollout batch. Samples with a zero advantage carry no gradient when the KL
        term is off, so they are never run through the model; they still count in every normalizer, so the
        update is exactly the one computed over all samples. Entropy and clip statistics cover the samples run."""
        samples = [s for s in samples if s.response_ids]
        stats = UpdateStats(lr=self.scheduler.get_last_lr()[0])
        if not samples:
            return stats
        active = [i for i, s in enumerate(samples) if s.advantage != 0.0 or self.algo.kl_coef > 0]
        was_training = self.model.training
        self.model.eval()
        old: dict[int, torch.Tensor] = dict(zip(active, self._logprobs(self.model, [samples[i] for i in active])))
        ref = (dict(zip(active, self._logprobs(self.reference, [samples[i] for i in active])))
               if self.reference is not None else None)
        self.model.train()
        order = list(range(len(samples)))
        rng = random.Random(seed)
        totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip": 0.0, "norm": 0.0, "tokens": 0}
        active_set = set(active)
        for _ in range(self.cfg.epochs):
            rng.shuffle(order)
            n_mb = min(self.cfg.minibatches, len(order))
            for mb in range(n_mb):
                idx = order[mb::n_mb]
                totals["norm"] += self._gradient_step(samples, idx, active_set, old, ref, totals)
                stats.gradient_steps += 1
        tokens = max(1, totals["tokens"])
        stats.loss = totals["loss"] / max(1, stats.gradient_steps)
        stats.grad_norm = totals["norm"] / max(1, stats.gradient_steps)
        stats.kl, stats.entropy, stats.clip_fraction = totals["kl"] / tokens, totals["entropy"] / tokens, totals["clip"] / tokens
        self.model.train(was_training)
        return stats

    def _gradient_step(self, samples, idx, active, old, ref, totals) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens = sum(len(samples[i].response_ids) for i in idx)
        run = [i for i in idx if i in active]
        for start in range(0, len(run), self.cfg.micro_batch_size):
            micro = run[start : start + self.cfg.micro_batch_size]
            batch = pack([samples[i].prompt_ids for i in micro], [samples[i].response_ids for i in micro], self.pad_id, self.device)
            logp, entropy = response_logprobs(self.model, batch, with_entropy=True, temperature=self.temperature)
            mask = batch.mask
            old_lp = _scatter(old, micro, mask)
            ref_lp = _scatter(ref, micro, mask) if ref is not None else None
            adv = torch.tensor([samples[i].advantage for i in micro], dtype=torch.float32, device=self.device)
            res = clipped_policy_loss(logp, old_lp, adv, mask, self.algo.normalization, self.max_new_tokens,
                                      self.algo.clip_low, self.algo.clip_high, ref_lp, self.algo.kl_coef,
                                      total_sequences=len(idx), total_tokens=n_tokens)
            res.loss.backward()
            m = mask.bool()
            k = int(m.sum())
            totals["loss"] += float(res.loss.detach())
            totals["tokens"] += k
            totals["clip"] += res.clip_fraction * k
            totals["entropy"] += float(entropy[m].sum())
            if ref_lp is not None:
                delta = ref_lp - logp.detach()
                totals["kl"] += float((torch.exp(delta) - delta - 1.0)[m].sum())
            else:
                totals["kl"] += res.approx_kl * k
        if not run:
            # a zero gradient still advances AdamW (its moments and step count), as the full computation would
            for p in self.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)) if params else 0.0
        self.optimizer.step()
        self.scheduler.step()
        return norm


def _scatter(rows: Mapping[int, torch.Tensor], micro: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Per-sample response log-probs back into the (B, R) right-aligned layout of ``mask``."""
    out = torch.zeros_like(mask)
    for k, i in enumerate(micro):
        out[k, mask[k].bool()] = rows[i].to(out.device, out.dtype)
    return out
