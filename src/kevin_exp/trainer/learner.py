"""The policy update of one step: old log-probs, then clipped-surrogate gradient steps over mini-batches.

``Learner`` is the interface the training loop uses (``train_step(batch) -> metrics``, ``state_dict``/
``load_state_dict`` for checkpoints, ``model`` for the weights a generator is given); ``trainer/learners.py``
builds the implementation named by ``trainer.backend``. ``TorchLearner`` trains in this process with AdamW;
``DeepSpeedLearner`` (``trainer/deepspeed_learner.py``) trains under ZeRO over every rank of the run, and its
checkpoints are sharded (``Checkpointer.save_sharded``), not a ``state_dict``.

Each turn is its own sample (prompt = task + history, response = this turn's output); prompt tokens
carry no loss. The rollout batch is split into ``minibatches`` gradient steps (Kevin: 2, the first
on-policy, the second off-policy against the stored old log-probs), each accumulated over micro-batches.
Tokens are scored under the distribution they were sampled from (the rollout's temperature and top_p),
and ``logprob_diff`` compares the learner's old log-probs with the generator's own: ~0 when both compute
the same distribution, and the first sign of a mismatch when they do not.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import torch

from kevin_exp.config import AlgorithmConfig, TrainerConfig
from kevin_exp.models.partial_checkpointing import limit_checkpointing
from kevin_exp.rl.loss import LossStats, clipped_policy_loss
from kevin_exp.trainer.batching import minibatch_plan
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
    # |generator's log-prob - learner's old log-prob| over response tokens (None: no sampled log-probs given)
    logprob_diff_mean: float | None = None
    logprob_diff_max: float | None = None


@dataclass
class LearnerSample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    # the generator's log-probs of response_ids as sampled (empty: not reported)
    sampled_logprobs: list[float] = field(default_factory=list)


@dataclass
class TrainBatch:
    samples: Sequence[LearnerSample]
    # seeds the mini-batch shuffle, so a resumed run takes the same gradient steps
    seed: int


class Learner(Protocol):
    model: torch.nn.Module

    def train_step(self, batch: TrainBatch) -> dict[str, Any]:
        """Gradient steps on one rollout batch; returns the step's learner metrics."""
        ...

    def generator_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The current weights, whole, one parameter at a time (pushed to a generator with its own copy)."""
        ...

    def parameter_count(self) -> int:
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything but the weights that an exact resume needs (optimizer, scheduler)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


def warmup_lambda(trainer: TrainerConfig, total_steps: int) -> Callable[[int], float]:
    """The lr factor after k gradient steps: a linear warm-up over ``warmup_ratio`` of them, then 1."""
    warmup = max(0, math.ceil(trainer.warmup_ratio * total_steps * trainer.minibatches * trainer.epochs))
    return lambda k: min(1.0, (k + 1) / (warmup + 1))


class TorchLearner:
    def __init__(self, model: torch.nn.Module, pad_id: int, trainer: TrainerConfig, algorithm: AlgorithmConfig,
                 max_new_tokens: int, total_steps: int, device: torch.device, temperature: float = 1.0,
                 top_p: float = 1.0, *, normalization: str) -> None:
        self.model, self.pad_id, self.cfg, self.algo = model, pad_id, trainer, algorithm
        self.normalization = normalization  # the run's headline `normalization` of the loss
        self.max_new_tokens, self.device = max_new_tokens, device
        self.temperature, self.top_p = temperature, top_p
        if trainer.checkpoint_layers < 1.0:  # checkpointing itself is model.gradient_checkpointing, enabled at load
            limit_checkpointing(model, trainer.checkpoint_layers)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=trainer.lr, weight_decay=trainer.weight_decay,
            betas=(trainer.adam_beta1, trainer.adam_beta2),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_lambda(trainer, total_steps))
        # a frozen reference policy costs a model's memory: only keep one when the KL term is on
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if algorithm.kl_coef > 0 else None

    def _logprobs(self, model: torch.nn.Module, samples: Sequence[LearnerSample]) -> list[torch.Tensor]:
        out = []
        with torch.no_grad():
            for i in range(0, len(samples), self.cfg.micro_batch_size):
                micro = samples[i : i + self.cfg.micro_batch_size]
                batch = pack([s.prompt_ids for s in micro], [s.response_ids for s in micro], self.pad_id, self.device)
                logp, _ = response_logprobs(model, batch, temperature=self.temperature, top_p=self.top_p,
                                             chunk_tokens=self.cfg.logprob_chunk_tokens)
                out.extend(row[batch.mask[k].bool()].cpu() for k, row in enumerate(logp))
        return out

    def generator_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.model.named_parameters())

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def train_step(self, batch: TrainBatch) -> dict[str, Any]:
        return asdict(self.update(batch.samples, batch.seed))

    def update(self, samples: Sequence[LearnerSample], seed: int) -> UpdateStats:
        """Gradient steps on one rollout batch. Samples with a zero advantage carry no gradient when the KL
        term is off, so they are never run through the model; they still count in every normalizer, so the
        update is exactly the one computed over all samples. Entropy and clip statistics cover the samples run.
        ``logprob_diff`` covers the samples run, or a micro-batch of the others when none is."""
        samples = [s for s in samples if s.response_ids]
        stats = UpdateStats(lr=self.scheduler.get_last_lr()[0])
        if not samples:
            return stats
        active = [i for i, s in enumerate(samples) if s.advantage != 0.0 or self.algo.kl_coef > 0]
        was_training = self.model.training
        self.model.eval()
        old: dict[int, torch.Tensor] = dict(zip(active, self._logprobs(self.model, [samples[i] for i in active])))
        probed = active or list(range(min(len(samples), self.cfg.micro_batch_size)))
        probe = old if active else dict(zip(probed, self._logprobs(self.model, [samples[i] for i in probed])))
        stats.logprob_diff_mean, stats.logprob_diff_max = _logprob_diff(samples, probe)
        ref = (dict(zip(active, self._logprobs(self.reference, [samples[i] for i in active])))
               if self.reference is not None else None)
        self.model.train()
        totals = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip": 0.0, "norm": 0.0, "tokens": 0}
        active_set = set(active)
        for idx in minibatch_plan(len(samples), self.cfg.minibatches, self.cfg.epochs, seed):
            totals["norm"] += self._gradient_step(samples, idx, active_set, old, ref, totals)
            stats.gradient_steps += 1
        set_means(stats, totals["loss"], totals["kl"], totals["entropy"], totals["clip"], totals["tokens"])
        stats.grad_norm = totals["norm"] / max(1, stats.gradient_steps)
        self.model.train(was_training)
        return stats

    def _gradient_step(self, samples, idx, active, old, ref, totals) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        n_tokens = sum(len(samples[i].response_ids) for i in idx)
        run = [i for i in idx if i in active]
        for start in range(0, len(run), self.cfg.micro_batch_size):
            micro = run[start : start + self.cfg.micro_batch_size]
            batch = pack([samples[i].prompt_ids for i in micro], [samples[i].response_ids for i in micro], self.pad_id, self.device)
            logp, entropy = response_logprobs(self.model, batch, with_entropy=True, temperature=self.temperature,
                                              top_p=self.top_p, chunk_tokens=self.cfg.logprob_chunk_tokens)
            mask = batch.mask
            old_lp = scatter_rows(old, micro, mask)
            ref_lp = scatter_rows(ref, micro, mask) if ref is not None else None
            adv = torch.tensor([samples[i].advantage for i in micro], dtype=torch.float32, device=self.device)
            res = clipped_policy_loss(logp, old_lp, adv, mask, self.normalization, self.max_new_tokens,
                                      self.algo.clip_low, self.algo.clip_high, ref_lp, self.algo.kl_coef,
                                      total_sequences=len(idx), total_tokens=n_tokens)
            res.loss.backward()
            add_micro_batch(totals, res, logp, entropy, mask, ref_lp)
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


def add_micro_batch(totals: dict[str, Any], res: LossStats, logp: torch.Tensor, entropy: torch.Tensor,
                    mask: torch.Tensor, ref_lp: torch.Tensor | None = None) -> None:
    """One micro-batch's loss, and its sums over response tokens (token count, clipped tokens, entropy, KL), added
    to ``totals`` (``set_means`` turns them into the step's statistics). The KL is the exact one against the
    reference policy's log-probs ``ref_lp`` when given, else the loss's own estimate against the old policy."""
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


def set_means(stats: UpdateStats, loss: float, kl: float, entropy: float, clip: float, tokens: float) -> None:
    """The step's statistics from the sums ``add_micro_batch`` made: the loss per gradient step, the rest per token."""
    tokens = max(1, tokens)
    stats.loss = loss / max(1, stats.gradient_steps)
    stats.kl, stats.entropy, stats.clip_fraction = kl / tokens, entropy / tokens, clip / tokens


def _logprob_diff(samples: Sequence[LearnerSample], learner_logp: Mapping[int, torch.Tensor]) -> tuple[float | None, float | None]:
    diffs = [(torch.tensor(samples[i].sampled_logprobs, dtype=torch.float64) - row.double()).abs()
             for i, row in learner_logp.items() if len(samples[i].sampled_logprobs) == len(row)]
    if not diffs:
        return None, None
    flat = torch.cat(diffs)
    return float(flat.mean()), float(flat.max())


def scatter_rows(rows: Mapping[int, torch.Tensor], micro: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Per-sample response log-probs back into the (B, R) right-aligned layout of ``mask``."""
    out = torch.zeros_like(mask)
    for k, i in enumerate(micro):
        out[k, mask[k].bool()] = rows[i].to(out.device, out.dtype)
    return out
