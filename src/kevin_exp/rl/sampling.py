"""The distribution tokens are sampled from: logits divided by the temperature, then cut to the top-p
nucleus. The generator samples through this function and the learner scores tokens through it, so the
importance ratios, clipping and KL are taken against the distribution that was actually sampled."""
from __future__ import annotations

import torch


def processed_logits(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``logits`` (..., vocab) as sampled: / temperature, and -inf outside the smallest set of tokens whose
    probability reaches ``top_p`` (the most likely token always stays). temperature 0 (greedy) is left at 1."""
    scores = logits / temperature if temperature > 0 and temperature != 1.0 else logits
    if top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1.0 - top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores
