"""PPO-style clipped surrogate with clip-higher (DAPO) and three loss normalisations.

normalization:
- ``constant``: sum over tokens / (num_sequences * max_new_tokens)  (Dr. GRPO; Kevin section 6.1)
- ``token``:    sum over tokens / number of response tokens in the batch
- ``sequence``: per-sequence token mean, then mean over sequences (GRPO's original 1/|o_i|)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NORMALIZATIONS = ("constant", "token", "sequence")


@dataclass
class LossStats:
    loss: torch.Tensor
    clip_fraction: float
    approx_kl: float
    ratio_mean: float


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    normalization: str,
    max_new_tokens: int,
    total_sequences: int | None = None,
    total_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce a (sequences, tokens) loss over the response mask.

    When one gradient step is accumulated over several micro-batches, pass the whole mini-batch's
    ``total_sequences`` and ``total_tokens``: the micro-batch losses then sum to the mini-batch loss.
    """
    mask = mask.to(per_token.dtype)
    n_seq = total_sequences if total_sequences is not None else per_token.shape[0]
    if normalization == "constant":
        return (per_token * mask).sum() / (n_seq * max_new_tokens)
    if normalization == "token":
        n_tok = torch.as_tensor(total_tokens, dtype=mask.dtype) if total_tokens is not None else mask.sum()
        return (per_token * mask).sum() / n_tok.clamp(min=1.0)
    if normalization == "sequence":
        per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_seq.sum() / n_seq
    raise ValueError(f"normalization={normalization!r}: expected one of {', '.join(NORMALIZATIONS)}")


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalization: str,
    max_new_tokens: int,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    total_sequences: int | None = None,
    total_tokens: int | None = None,
) -> LossStats:
    """logprobs/old_logprobs/mask: (sequences, tokens); advantages: (sequences,)."""
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs reference log-probs")
        # k3 estimator of KL(policy || reference), as in GRPO
        delta = ref_logprobs - logprobs
        per_token = per_token + kl_coef * (torch.exp(delta) - delta - 1.0)
    loss = aggregate(per_token, mask, normalization, max_new_tokens, total_sequences, total_tokens)
    with torch.no_grad():
        m = mask.bool()
        n = m.sum().clamp(min=1)
        clip_frac = float(((unclipped != clipped) & m).sum() / n)
        approx_kl = float(((old_logprobs - logprobs)[m]).mean()) if m.any() else 0.0
        ratio_mean = float(ratio[m].mean()) if m.any() else 1.0
    return LossStats(loss, clip_frac, approx_kl, ratio_mean)
