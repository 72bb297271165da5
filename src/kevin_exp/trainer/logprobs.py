"""Token log-probabilities of responses under a causal LM, computed only where the loss needs them.

Sequences (prompt + response) are left-padded so every response ends at the last position; the model is
then asked for the logits of the last ``max_response + 1`` positions only (``logits_to_keep``), which
keeps the (tokens x vocabulary) tensor small when prompts are long.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from kevin_exp.rl.sampling import processed_logits

LOGPROB_FLOOR = -1e3


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    position_ids: torch.Tensor  # (B, L)
    targets: torch.Tensor  # (B, R): response tokens, right-aligned, 0 where masked
    mask: torch.Tensor  # (B, R): 1 on response tokens
    keep: int  # logits kept: R + 1


def pack(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_id: int, device: torch.device) -> PackedBatch:
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    length = max(len(s) for s in seqs)
    r_len = max(1, max(len(r) for r in responses))
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), length), dtype=torch.long)
    targets = torch.zeros((len(seqs), r_len), dtype=torch.long)
    mask = torch.zeros((len(seqs), r_len), dtype=torch.float32)
    for i, (s, r) in enumerate(zip(seqs, responses)):
        ids[i, length - len(s) :] = torch.tensor(s, dtype=torch.long)
        attn[i, length - len(s) :] = 1
        if r:
            targets[i, r_len - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, r_len - len(r) :] = 1.0
    position_ids = (attn.cumsum(dim=1) - 1).clamp(min=0)
    return PackedBatch(ids.to(device), attn.to(device), position_ids.to(device), targets.to(device), mask.to(device), r_len + 1)


def response_logprobs(model: torch.nn.Module, batch: PackedBatch, with_entropy: bool = False,
                      temperature: float = 1.0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs of the response tokens (and their per-token entropy when asked).

    The logits go through the sampler's own ``processed_logits`` (temperature, then the top-p nucleus), so
    the ratios are taken against the distribution the tokens were actually drawn from. A token outside the
    nucleus (possible only when the weights moved since sampling) gets a floor log-prob instead of -inf.
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                logits_to_keep=batch.keep, use_cache=False)
    # position j of the kept logits predicts kept token j + 1
    logits = processed_logits(out.logits[:, :-1, :].float(), temperature, top_p)
    logp = torch.log_softmax(logits, dim=-1)
    token_logp = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1).clamp(min=LOGPROB_FLOOR)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            p = logp.exp()
            entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    return token_logp, entropy
