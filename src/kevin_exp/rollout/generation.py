"""Batched sampling of responses from the policy.

``Generator`` is the interface the rollout loop uses (prompts in; token ids, text and the log-probs of the
sampled tokens out; ``update_weights``/``sleep``/``wake`` for engines that hold their own copy of the
weights); ``rollout/generators.py`` builds the implementation named by ``rollout.backend``. ``HFGenerator``
implements it with Hugging Face ``generate`` on the policy's own device, sampling through
``rl.sampling.processed_logits`` (the function the learner scores with) and recording each sampled token's
log-probability under that processed distribution. Outputs are a pure function of (prompts, seed, weights)
and leave the caller's RNG state untouched.

Progress within a call: a caller that wants it wraps the call in ``reporting_progress(listener)``; a generator that
can tell (``HFGenerator``) then calls ``listener(sequences finished, tokens drawn by the batch it samples now)`` as
it goes. It is a context variable rather than an argument so that the ``Generator`` interface stays as it is for
the generators that cannot tell (vLLM's offline ``generate``, scripted responses).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import torch
from transformers import (
    CompileConfig,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)

from kevin_exp.models import Policy
from kevin_exp.rl.sampling import processed_logits

# (sequences finished, tokens drawn by the batch being sampled) -> None; set by reporting_progress
ProgressListener = Callable[[int, int], None]
_listener: contextvars.ContextVar[ProgressListener | None] = contextvars.ContextVar("generation_progress", default=None)


@contextlib.contextmanager
def reporting_progress(listener: ProgressListener | None) -> Iterator[None]:
    """generate() calls made in this context (on this thread) report their progress to ``listener`` (module doc)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


@dataclass
class Generation:
    prompt_ids: list[int]
    # generated tokens up to and including EOS, or the token that completed a stop string, if one was
    # produced; never padding
    response_ids: list[int]
    # the response decoded without special tokens (cut before a stop string)
    text: str
    # stopped at max_new_tokens without an EOS or a stop string
    truncated: bool
    # log-probability of each response token under the distribution it was sampled from (after temperature
    # and top-p); empty when the generator does not report them
    logprobs: list[float] = field(default_factory=list)


class Generator(Protocol):
    # true for an engine with its own copy of the weights: the learner's are pushed to it every step
    owns_weights: bool

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int, seeds: Sequence[int] | None = None,
                 trajectories: Sequence[int] | None = None) -> list[Generation]:
        """One generation per prompt, in order. ``seeds`` (one per prompt): each prompt's tokens are a function of
        (prompt, its seed, the weights) alone, whatever it is batched with; without them, of the call's ``seed``.
        ``trajectories``: each prompt's trajectory within its task (what a scripted generator answers by)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the learner's current weights (an engine with its own copy of the model)."""

    def sleep(self) -> None:
        """Release generation memory (weights, KV cache) while the learner trains."""

    def wake(self) -> None:
        """Take the memory back before the next generation."""

    def pop_stats(self) -> dict[str, float]:
        """Time and memory of the engine's transitions since the last call (metrics columns)."""

    def close(self) -> None: ...


class SharesTheLearnersWeights:
    """For generators that sample with the learner's own model in this process: there are no weights to push
    and no memory of their own to release."""

    owns_weights = False

    def pop_stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass


class _SampledDistribution(LogitsProcessor):
    """The last logits processor (after it, ``generate`` only draws from the scores): applies the sampling
    distribution and keeps this step's log-probabilities until the drawn token is known. Given one random
    generator per row, it draws each row's token itself and hands ``generate`` (decoding greedily then) scores
    that allow only that token, so a row's sample does not depend on the rows beside it."""

    def __init__(self, temperature: float, top_p: float, row_generators: list[torch.Generator] | None = None) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.row_generators = row_generators
        self.step_logp: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = processed_logits(scores, self.temperature, self.top_p)
        self.step_logp = torch.log_softmax(scores.float(), dim=-1)
        if self.row_generators is None:
            return scores
        probs = self.step_logp.exp()
        drawn = torch.cat([torch.multinomial(probs[row], 1, generator=g) for row, g in enumerate(self.row_generators)])
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, drawn.view(-1, 1), 0.0)


class _DrawnTokenLogprobs(StoppingCriteria):
    """Called by ``generate`` with the drawn token appended: records its log-probability and, given stop
    strings, ends the rows whose response (the tokens after the ``prompt_width`` prompt columns) now ends a
    stop string, noting the first step each row was ended that way (``stop_steps``)."""

    def __init__(self, distribution: _SampledDistribution, stop_strings: StopStringCriteria | None = None,
                 prompt_width: int = 0, on_token: Callable[[int], None] | None = None) -> None:
        self.distribution = distribution
        self.stop_strings, self.prompt_width = stop_strings, prompt_width
        # called with the number of tokens drawn so far (a progress display)
        self.on_token = on_token
        # kept on the model's device (no host sync per step); stacked once generate returns
        self.columns: list[torch.Tensor] = []
        self._stop_steps: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        step_logp = self.distribution.step_logp
        assert step_logp is not None, "generate called the stopping criteria before the logits processors"
        self.columns.append(step_logp.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.distribution.step_logp = None
        if self.on_token is not None:
            self.on_token(len(self.columns))
        if self.stop_strings is None:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        # only the response is matched: a stop string may not begin inside the prompt
        hit = self.stop_strings(input_ids[:, self.prompt_width:], scores)
        if self._stop_steps is None:
            self._stop_steps = torch.full((input_ids.shape[0],), -1, dtype=torch.long, device=input_ids.device)
        step = len(self.columns) - 1
        self._stop_steps = torch.where(hit & (self._stop_steps < 0), step, self._stop_steps)
        return hit

    def logprobs(self, rows: int) -> list[list[float]]:
        """(rows x steps) log-probs of the drawn tokens, one list per row."""
        return torch.stack(self.columns, dim=1).cpu().tolist() if self.columns else [[] for _ in range(rows)]

    def stop_steps(self, rows: int) -> list[int]:
        """Per row, the index of the response token that completed a stop string; -1 where none did."""
        return self._stop_steps.cpu().tolist() if self._stop_steps is not None else [-1] * rows


class HFGenerator(SharesTheLearnersWeights):
    """Samples with ``model.generate`` on the learner's own model (no weights to push, no memory to release).

    Prompts are sorted by length (longest first, stable) and cut into calls of at most ``batch_size`` rows
    and, when ``batch_tokens`` > 0, at most ``batch_tokens`` padded tokens (rows x (longest prompt +
    max_new_tokens)); a prompt over that budget on its own gets a call of its own. Rows are left-padded;
    results come back in input order. Each call's seed is derived from ``seed`` and the call's index only.
    ``stop``: strings that end a response (the token completing one is kept, the text is cut before it).
    ``compile``: a static KV cache and a ``torch.compile``d decoding step (CUDA graphs on a GPU).
    """

    # under compile, the static cache's length is rounded up to a multiple of this, so prompt lengths that
    # vary a little from one generate() to the next reuse one cache shape (no recompilation)
    CACHE_LENGTH_STEP = 256

    def __init__(self, policy: Policy, batch_size: int = 16, batch_tokens: int = 0, stop: Sequence[str] = (),
                 compile: bool = False) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1 (sequences per generate call)")
        if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 0:
            raise ValueError(f"batch_tokens={batch_tokens!r}: expected an integer >= 0 (padded tokens per generate "
                             f"call; 0 for no limit)")
        if isinstance(stop, str):
            raise ValueError(f"stop={stop!r}: expected a list of stop strings, not one string")
        stop = tuple(stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop={list(stop)!r}: every stop string must be a non-empty string (an empty one "
                             f"would end every response)")
        self.policy = policy
        self.batch_size, self.batch_tokens, self.stop, self.compile = batch_size, batch_tokens, stop, bool(compile)
        self.eos_ids = _eos_ids(policy)
        if not self.eos_ids:
            raise ValueError("the tokenizer and the model's generation config name no EOS token")
        pad = policy.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        # preprocesses the whole vocabulary once (transformers also caches it per tokenizer and strings)
        self._stop_strings = StopStringCriteria(policy.tokenizer, list(stop)) if stop else None

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int, seeds: Sequence[int] | None = None,
                 trajectories: Sequence[int] | None = None) -> list[Generation]:
        """One generation per prompt, in input order; ``temperature`` 0 decodes greedily; ``seeds``: one per
        prompt (see ``Generator.generate``)."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds: {len(seeds)} for {len(prompts)} prompts")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: expected >= 1")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if not prompts:
            return []
        per_row = seeds is not None and temperature > 0
        # with a seed per row the rows are drawn by _SampledDistribution and generate() only takes its pick
        config = self._generation_config(max_new_tokens, greedy=temperature <= 0 or per_row)
        model = self.policy.model
        was_training, defaults = model.training, model.generation_config
        # generate() fills every unset option from model.generation_config. The learner's ratios assume
        # tokens come from the policy's own distribution, so sampling tweaks a checkpoint suggests
        # (top_k, min_p, repetition penalty, ...) must not apply. Swapped back below.
        model.generation_config = config
        model.eval()
        out: list[Generation | None] = [None] * len(prompts)
        report, finished = _listener.get(), 0
        try:
            with torch.no_grad():
                calls = plan_calls([len(p) for p in prompts], max_new_tokens, self.batch_size, self.batch_tokens)
                for index, rows in enumerate(calls):
                    on_token = None if report is None else lambda tokens, before=finished: report(before, tokens)
                    generations = self._chunk([prompts[i] for i in rows], config, max_new_tokens, temperature,
                                              top_p, call_seed(seed, index),
                                              [seeds[i] for i in rows] if per_row else None, on_token)
                    for i, generation in zip(rows, generations):
                        out[i] = generation
                    finished += len(rows)
                    if report is not None:
                        report(finished, 0)
        finally:
            model.generation_config = defaults
            model.train(was_training)
        assert all(g is not None for g in out)
        return out  # type: ignore[return-value]

    def _generation_config(self, max_new_tokens: int, greedy: bool) -> GenerationConfig:
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, num_beams=1,
                                  eos_token_id=list(self.eos_ids), pad_token_id=self.pad_id,
                                  bos_token_id=self.policy.model.generation_config.bos_token_id)
        if not greedy:
            # temperature and top-p are applied by _SampledDistribution, not by the library's own warpers, so
            # the sampled distribution is exactly the learner's; top_k=0: no top-k cut (the fallback is 50)
            config.update(temperature=1.0, top_p=1.0, top_k=0)
        if self.compile:
            on_cuda = self.policy.model.device.type == "cuda"
            # reduce-overhead: the decoding step replays as a CUDA graph; on other devices plain inductor
            compile_config = CompileConfig(fullgraph=False, mode="reduce-overhead" if on_cuda else "default")
            # generate() compiles only on accelerators unless told otherwise; compile=true means compile
            compile_config._compile_all_devices = True
            config.update(cache_implementation="static", compile_config=compile_config, disable_compile=False)
        else:
            config.update(disable_compile=True)
        return config

    def _chunk(self, prompts: list[list[int]], config: GenerationConfig, max_new_tokens: int, temperature: float,
               top_p: float, seed: int, row_seeds: list[int] | None = None,
               on_token: Callable[[int], None] | None = None) -> list[Generation]:
        device = self.policy.model.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        if self.compile:
            step = self.CACHE_LENGTH_STEP
            config.max_cache_len = -(-(width + max_new_tokens) // step) * step
        generators = None if row_seeds is None else [torch.Generator(device=device).manual_seed(int(r)) for r in row_seeds]
        distribution = _SampledDistribution(temperature, top_p, generators)
        recorder = _DrawnTokenLogprobs(distribution, self._stop_strings, width, on_token)
        with _forked_rng(device, seed):
            sequences = self.policy.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                                   generation_config=config,
                                                   logits_processor=LogitsProcessorList([distribution]),
                                                   stopping_criteria=StoppingCriteriaList([recorder]))
        new_tokens = sequences[:, width:].tolist()
        logprobs, stop_steps = recorder.logprobs(len(prompts)), recorder.stop_steps(len(prompts))
        eos = set(self.eos_ids)
        result = []
        for prompt, tokens, token_logprobs, stop_step in zip(prompts, new_tokens, logprobs, stop_steps):
            # a finished row (EOS or stop string) waits for the rest of the call, padded
            end = next((i for i, t in enumerate(tokens) if t in eos), None)
            stopped_on_string = stop_step >= 0 and (end is None or stop_step < end)
            if stopped_on_string:
                end = stop_step
            response = tokens if end is None else tokens[:end + 1]
            text = self.policy.tokenizer.decode(response, skip_special_tokens=True)
            if stopped_on_string:
                text = _cut_at_stop(text, self.stop)
            result.append(Generation(prompt_ids=list(prompt), response_ids=response, text=text, truncated=end is None,
                                     logprobs=token_logprobs[:len(response)]))
        return result


def plan_calls(lengths: Sequence[int], max_new_tokens: int, batch_size: int, batch_tokens: int = 0) -> list[list[int]]:
    """Prompt indices per generate() call: sorted by length, longest first (stable), each call at most
    ``batch_size`` rows and, when ``batch_tokens`` > 0, rows x (longest prompt + max_new_tokens) <=
    ``batch_tokens`` (a prompt over that on its own goes alone). The longest call comes first, so running
    out of memory shows at once and a static cache is sized once."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    calls: list[list[int]] = []
    for i in order:
        if calls:
            current = calls[-1]
            # the call's first row is its longest
            padded = (len(current) + 1) * (lengths[current[0]] + max_new_tokens)
            if len(current) < batch_size and (batch_tokens == 0 or padded <= batch_tokens):
                current.append(i)
                continue
        calls.append([i])
    return calls


def call_seed(seed: int, index: int) -> int:
    """The seed of a generate() call: a hash of (seed, the call's index), so neighbouring seeds share no call
    seed (``seed + index`` would give seed 7's second call the same stream as seed 8's first)."""
    digest = hashlib.blake2b(f"{int(seed)}/{int(index)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # < 2**63, accepted by every generator


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to its first stop string (whole when none appears in the decoded text)."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[:min(found)] if found else text


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
