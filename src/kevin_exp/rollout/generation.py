"""Batched sampling of responses from the policy.

``Generator`` is the interface the rollout loop uses; ``HFGenerator`` implements it with Hugging Face
``generate`` on the policy's own device. Outputs are a pure function of (prompts, seed, weights) and
leave the caller's RNG state untouched.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch
from transformers import GenerationConfig

from kevin_exp.models import Policy


@dataclass
class Generation:
    prompt_ids: list[int]
    # generated tokens up to and including EOS if one was produced; never padding
    response_ids: list[int]
    # the response decoded without special tokens
    text: str
    # stopped at max_new_tokens without an EOS
    truncated: bool


class Generator(Protocol):
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[Generation]: ...


class HFGenerator:
    """Samples with ``model.generate`` in left-padded chunks of at most ``batch_size`` prompts."""

    def __init__(self, policy: Policy, batch_size: int = 16) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: expected >= 1")
        self.policy = policy
        self.batch_size = batch_size
        self.eos_ids = _eos_ids(policy)
        if not self.eos_ids:
            raise ValueError("the tokenizer and the model's generation config name no EOS token")
        pad = policy.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[Generation]:
        """One generation per prompt, in input order; ``temperature`` 0 decodes greedily."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: expected >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        config = self._generation_config(max_new_tokens, temperature, top_p)
        model = self.policy.model
        was_training, defaults = model.training, model.generation_config
        # generate() fills every unset option from model.generation_config. The learner's ratios assume
        # tokens come from the policy's own distribution, so sampling tweaks a checkpoint suggests
        # (top_k, min_p, repetition penalty, ...) must not apply. Swapped back below.
        model.generation_config = config
        model.eval()
        out: list[Generation] = []
        try:
            with torch.no_grad():
                for index, start in enumerate(range(0, len(prompts), self.batch_size)):
                    out.extend(self._chunk(prompts[start:start + self.batch_size], config, seed + index))
        finally:
            model.generation_config = defaults
            model.train(was_training)
        return out

    def _generation_config(self, max_new_tokens: int, temperature: float, top_p: float) -> GenerationConfig:
        sampling = temperature > 0
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sampling, num_beams=1,
                                  eos_token_id=list(self.eos_ids), pad_token_id=self.pad_id,
                                  bos_token_id=self.policy.model.generation_config.bos_token_id)
        if sampling:
            # top_k=0: no top-k cut (the library's fallback would be 50)
            config.update(temperature=float(temperature), top_p=float(top_p), top_k=0)
        return config

    def _chunk(self, prompts: list[list[int]], config: GenerationConfig, seed: int) -> list[Generation]:
        device = self.policy.model.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        with _forked_rng(device, seed):
            sequences = self.policy.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                                   generation_config=config)
        new_tokens = sequences[:, width:].tolist()
        eos = set(self.eos_ids)
        result = []
        for prompt, tokens in zip(prompts, new_tokens):
            stop = next((i for i, t in enumerate(tokens) if t in eos), None)
            # after the first EOS come only pads (finished rows wait for the rest of the batch)
            response = tokens if stop is None else tokens[:stop + 1]
            text = self.policy.tokenizer.decode(response, skip_special_tokens=True)
            result.append(Generation(prompt_ids=list(prompt), response_ids=response, text=text, truncated=stop is None))
        return result


def _eos_ids(policy: Policy) -> list[int]:
    ids: list[int] = []
    configured = policy.model.generation_config.eos_token_id
    for value in ([configured] if isinstance(configured, int) else list(configured or [])) + [policy.tokenizer.eos_token_id]:
        if value is not None and value not in ids:
            ids.append(int(value))
    return ids


@contextlib.contextmanager
def _forked_rng(device: torch.device, seed: int) -> Iterator[None]:
    """Seed the CPU generator (and ``device``'s on CUDA) inside a fork of their states, restored on exit."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        with torch.random.fork_rng(devices=[index], device_type="cuda"):
            torch.random.default_generator.manual_seed(seed)
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
            yield
    else:
        # not torch.manual_seed: that would also reseed every GPU, which this fork does not restore
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            yield
