"""Batched sampling of responses from the policy.

``Generator`` is the interface the rollout loop uses (prompts in; token ids, text and the log-probs of the
sampled tokens out; ``update_weights``/``sleep``/``wake`` for engines that hold their own copy of the
weights); ``build_generator`` picks the implementation named by ``rollout.backend``. ``HFGenerator``
implements it with Hugging Face ``generate`` on the policy's own device, sampling through
``rl.sampling.processed_logits`` (the function the learner scores with) and recording each sampled token's
log-probability under that processed distribution. Outputs are a pure function of (prompts, seed, weights)
and leave the caller's RNG state untouched.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from kevin_exp.config import RolloutConfig
from kevin_exp.models import Policy
from kevin_exp.rl.sampling import processed_logits
from kevin_exp.tasks import Problem


@dataclass
class Generation:
    prompt_ids: list[int]
    # generated tokens up to and including EOS if one was produced; never padding
    response_ids: list[int]
    # the response decoded without special tokens
    text: str
    # stopped at max_new_tokens without an EOS
    truncated: bool
    # log-probability of each response token under the distribution it was sampled from (after temperature
    # and top-p); empty when the generator does not report them
    logprobs: list[float] = field(default_factory=list)


class Generator(Protocol):
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int) -> list[Generation]: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the learner's current weights (an engine with its own copy of the model)."""

    def sleep(self) -> None:
        """Release generation memory (weights, KV cache) while the learner trains."""

    def wake(self) -> None:
        """Take the memory back before the next generation."""


def build_generator(cfg: RolloutConfig, policy: Policy, tasks: list[Problem], kernel_backend: str,
                    n_trajectories: int) -> Generator:
    if cfg.backend == "hf":
        return HFGenerator(policy, cfg.generation_batch_size)
    if cfg.backend == "scripted":
        from kevin_exp.rollout.scripted import ScriptedGenerator

        return ScriptedGenerator(policy.tokenizer, tasks, kernel_backend, n_trajectories)
    raise ValueError(f"rollout.backend={cfg.backend!r} has no generator")  # refused at composition already


class SharesTheLearnersWeights:
    """For generators that sample with the learner's own model in this process: there are no weights to push
    and no memory of their own to release."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass


class _SampledDistribution(LogitsProcessor):
    """The last logits processor (after it, ``generate`` only draws from the scores): applies the sampling
    distribution and keeps this step's log-probabilities until the drawn token is known."""

    def __init__(self, temperature: float, top_p: float) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.step_logp: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = processed_logits(scores, self.temperature, self.top_p)
        self.step_logp = torch.log_softmax(scores.float(), dim=-1)
        return scores


class _DrawnTokenLogprobs(StoppingCriteria):
    """Called by ``generate`` with the drawn token appended: records its log-probability; stops nothing."""

    def __init__(self, distribution: _SampledDistribution) -> None:
        self.distribution = distribution
        self.columns: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        step_logp = self.distribution.step_logp
        assert step_logp is not None, "generate called the stopping criteria before the logits processors"
        self.columns.append(step_logp.gather(-1, input_ids[:, -1:]).squeeze(-1).cpu())
        self.distribution.step_logp = None
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HFGenerator(SharesTheLearnersWeights):
    """Samples with ``model.generate`` in left-padded chunks of at most ``batch_size`` prompts. The policy's
    model is the learner's, so there are no weights to push and no memory to release."""

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
        config = self._generation_config(max_new_tokens, greedy=temperature <= 0)
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
                    out.extend(self._chunk(prompts[start:start + self.batch_size], config, temperature, top_p,
                                           seed + index))
        finally:
            model.generation_config = defaults
            model.train(was_training)
        return out

    def _generation_config(self, max_new_tokens: int, greedy: bool) -> GenerationConfig:
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, num_beams=1,
                                  eos_token_id=list(self.eos_ids), pad_token_id=self.pad_id,
                                  bos_token_id=self.policy.model.generation_config.bos_token_id)
        if not greedy:
            # temperature and top-p are applied by _SampledDistribution, not by the library's own warpers, so
            # the sampled distribution is exactly the learner's; top_k=0: no top-k cut (the fallback is 50)
            config.update(temperature=1.0, top_p=1.0, top_k=0)
        return config

    def _chunk(self, prompts: list[list[int]], config: GenerationConfig, temperature: float, top_p: float,
               seed: int) -> list[Generation]:
        device = self.policy.model.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        distribution = _SampledDistribution(temperature, top_p)
        recorder = _DrawnTokenLogprobs(distribution)
        with _forked_rng(device, seed):
            sequences = self.policy.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                                   generation_config=config,
                                                   logits_processor=LogitsProcessorList([distribution]),
                                                   stopping_criteria=StoppingCriteriaList([recorder]))
        new_tokens = sequences[:, width:].tolist()
        logprobs = torch.stack(recorder.columns, dim=1).tolist() if recorder.columns else [[] for _ in prompts]
        eos = set(self.eos_ids)
        result = []
        for prompt, tokens, token_logprobs in zip(prompts, new_tokens, logprobs):
            stop = next((i for i, t in enumerate(tokens) if t in eos), None)
            # after the first EOS come only pads (finished rows wait for the rest of the batch)
            response = tokens if stop is None else tokens[:stop + 1]
            text = self.policy.tokenizer.decode(response, skip_special_tokens=True)
            result.append(Generation(prompt_ids=list(prompt), response_ids=response, text=text, truncated=stop is None,
                                     logprobs=token_logprobs[:len(response)]))
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
