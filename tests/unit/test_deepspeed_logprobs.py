"""Log-probs scored chunk by chunk over the response positions equal the model's own full logits, in value
and in gradient, for every chunk size (both learners use the chunked path)."""
from __future__ import annotations

import pytest
import torch

from kevin_exp.config import ModelConfig
from kevin_exp.models import load_policy
from kevin_exp.trainer.logprobs import full_logits_logprobs, pack, response_logprobs


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_policy(ModelConfig(name="tiny", source="tiny")).model.train()


def _batch(pad_id: int = 0):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    responses = [[10, 11, 12, 13], [14], [15, 16, 17]]
    return pack(prompts, responses, pad_id, torch.device("cpu"))


def _grads(model, logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (logp * mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk", [1, 3, 5, 1000])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_chunked_log_probs_equal_the_full_logits_ones(model, chunk, temperature, top_p):
    batch = _batch()
    full = full_logits_logprobs(model, batch, temperature, top_p)
    ref_grads = _grads(model, full, batch.mask)
    chunked, _ = response_logprobs(model, batch, temperature=temperature, top_p=top_p, chunk_tokens=chunk)
    # the same float32 operations on the same rows: equal up to the matmul's blocking of a different shape
    assert torch.allclose(chunked, full, atol=1e-6, rtol=0)
    assert (chunked[batch.mask == 0] == 0).all()
    grads = _grads(model, chunked, batch.mask)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        # sums over tokens taken chunk by chunk reorder float32 additions: within 1e-4 of the gradient's
        # scale (a wrong gradient is off by about its whole scale)
        scale = float(ref_grads[name].abs().max())
        assert float((grads[name] - ref_grads[name]).abs().max()) <= 1e-4 * scale, name


def test_padding_chunks_change_nothing(model):
    batch = _batch()
    with torch.no_grad():
        plain, ent = response_logprobs(model, batch, with_entropy=True, chunk_tokens=2)
        padded, ent_padded = response_logprobs(model, batch, with_entropy=True, chunk_tokens=2, min_chunks=9)
    assert torch.equal(plain, padded) and torch.equal(ent, ent_padded)
    assert (ent[batch.mask.bool()] > 0).all()
