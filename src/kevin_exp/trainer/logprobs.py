"""Token log-probabilities of responses under a causal LM, computed only where the loss needs them.

Sequences (prompt + response) are left-padded so every response ends at the last position. The model runs
up to its final hidden states only; the output layer then scores the response positions (no prompt or
padding position) a chunk of ``chunk_tokens`` at a time: output layer -> fp32 logits -> sampling transform ->
log-softmax -> the target token. Under autograd each chunk is recomputed in the backward pass instead of
keeping its logits, so the (tokens x vocabulary) fp32 logits of one chunk, not of the whole micro-batch, bound
the memory (a 150k vocabulary makes them the largest tensor of a step). Models whose output layer is not a
plain projection of the decoder's last hidden state (logit soft-capping) are not supported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.utils.checkpoint

from kevin_exp.rl.sampling import processed_logits

LOGPROB_FLOOR = -1e3
DEFAULT_CHUNK_TOKENS = 4096


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
                      temperature: float = 1.0, top_p: float = 1.0,
                      chunk_tokens: int = DEFAULT_CHUNK_TOKENS, min_chunks: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log-probs of the response tokens (and their per-token entropy when asked), 0 where masked.

    The logits go through the sampler's own ``processed_logits`` (temperature, then the top-p nucleus), so
    the ratios are taken against the distribution the tokens were actually drawn from. A token outside the
    nucleus (possible only when the weights moved since sampling) gets a floor log-prob instead of -inf.
    ``model`` may be a DeepSpeed engine: it is called as a whole (ZeRO-3's hooks gather its parameters).
    Under ZeRO-3 every call of the output layer is a collective, so all ranks must make as many:
    ``min_chunks`` pads the chunk count with empty chunks (``chunk_count`` gives this batch's own).
    """
    module = getattr(model, "module", model)
    hidden = final_hidden_states(model, module, batch)[:, -batch.keep : -1, :]  # position j predicts response token j
    m = batch.mask.bool()
    h, targets = hidden[m], batch.targets[m]
    head = module.get_output_embeddings()
    logp_parts, entropy_parts = [], []
    for start in range(0, max(h.shape[0], min_chunks * chunk_tokens), chunk_tokens):
        args = (head, h[start : start + chunk_tokens], targets[start : start + chunk_tokens], temperature, top_p, with_entropy)
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = torch.utils.checkpoint.checkpoint(_score_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _score_chunk(*args)
        logp_parts.append(lp)
        entropy_parts.append(ent)
    token_logp = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    token_logp = token_logp.masked_scatter(m, torch.cat(logp_parts)) if logp_parts else token_logp
    entropy = None
    if with_entropy:
        entropy = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
        if entropy_parts:
            entropy[m] = torch.cat(entropy_parts)
    return token_logp, entropy


def chunk_count(batch: PackedBatch, chunk_tokens: int) -> int:
    return -(-int(batch.mask.sum()) // chunk_tokens)


def final_hidden_states(model: torch.nn.Module, module: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """The decoder's last hidden states (B, L, H), from one call of the whole model that scores no position
    (``logits_to_keep`` an empty index), so the model's own forward (and a wrapper's hooks) run unchanged."""
    captured: list[torch.Tensor] = []
    handle = module.get_decoder().register_forward_hook(lambda _m, _args, out: captured.append(out[0]))
    try:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
              logits_to_keep=torch.empty(0, dtype=torch.long, device=batch.input_ids.device), use_cache=False)
    finally:
        handle.remove()
    return captured[-1]


def _score_chunk(head: torch.nn.Module, h: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float,
                 with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(processed_logits(head(h).float(), temperature, top_p), dim=-1)
    token_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).clamp(min=LOGPROB_FLOOR)
    if not with_entropy:
        return token_logp, torch.zeros_like(token_logp)
    with torch.no_grad():
        p = logp.exp()
        entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    return token_logp, entropy


def full_logits_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0,
                         top_p: float = 1.0) -> torch.Tensor:
    """The same (B, R) log-probs from the model's own logits of every kept position at once (the reference
    the chunked path is tested against), 0 where masked."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                logits_to_keep=batch.keep, use_cache=False)
    logp = torch.log_softmax(processed_logits(out.logits[:, :-1, :].float(), temperature, top_p), dim=-1)
    token_logp = logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1).clamp(min=LOGPROB_FLOOR)
    return token_logp * batch.mask
