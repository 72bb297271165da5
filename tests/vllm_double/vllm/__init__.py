"""A test double of the parts of vLLM 0.33.0 that ``kevin_exp.rollout.vllm_engine`` uses, for machines where vLLM
cannot run (it needs a CUDA GPU). Put ``tests/vllm_double`` first on ``sys.path`` (or ``PYTHONPATH``) and
``import vllm`` finds it.

Written from vLLM 0.33.0's API (``vllm.LLM``, ``vllm.SamplingParams``, ``RequestOutput``/``CompletionOutput``,
``Logprob``) and kept to what the project calls. It is strict where vLLM is lenient, so a wrong call fails a
test instead of producing garbage on a cluster:

- constructor: only keyword names vLLM 0.33 accepts; the external-launcher executor needs RANK, LOCAL_RANK,
  MASTER_ADDR, MASTER_PORT and ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; ``gpu_memory_utilization`` in (0, 1];
  ``kv_cache_memory_bytes`` > 0; ``logprobs_mode`` one of vLLM's four; the model folder must hold a config.
- sleep/wake: vLLM's state machine (level 0 pauses scheduling; 1 offloads weights and drops the KV cache; 2
  drops both, weights then hold garbage until reloaded; ``wake_up(tags)`` with tags from weights, kv_cache,
  scheduling; fully awake resumes scheduling; ``release_kv_cache_memory`` needs a completed pause and resident
  memory). Sleep needs ``enable_sleep_mode``.
- ``generate`` refuses while anything is asleep, and while the weights hold garbage after a level-2 sleep
  (vLLM would silently generate from it); ``apply_model`` refuses while the weights are not resident.
- weight loading (``model.load_weights`` through ``apply_model``): names and shapes must match the model.

Sampling is real: the model (random weights from the folder's config with ``load_format="dummy"``) decodes each
request token by token, with temperature and top-p applied as vLLM's sampler does, drawing from a generator
seeded by the request's seed; ``logprobs=0`` returns the sampled token's log-prob under the processed
distribution (``logprobs_mode="processed_logprobs"``) or the raw one.

Every call is appended to ``LLM.log`` (and, when ``KX_VLLM_DOUBLE_LOG`` names a file, written there as JSON
lines, for engines in other processes); ``LLM.instances`` holds the engines made in this process.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

__version__ = "0.33.0"

_LLM_KEYWORDS = {
    # vllm.LLM.__init__ (0.33.0)
    "runner", "convert", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "allowed_local_media_path", "allowed_media_domains", "tensor_parallel_size", "dtype", "quantization", "revision",
    "tokenizer_revision", "chat_template", "seed", "gpu_memory_utilization", "cpu_offload_gb", "offload_group_size",
    "offload_num_in_group", "offload_prefetch_step", "offload_params", "enforce_eager", "enable_return_routed_experts",
    "return_sampling_mask", "disable_custom_all_reduce", "hf_token", "hf_overrides", "mm_processor_kwargs",
    "pooler_config", "structured_outputs_config", "profiler_config", "attention_config", "kv_cache_memory_bytes",
    "compilation_config", "quantization_config", "logits_processors", "spec_method", "spec_model", "spec_tokens",
    # EngineArgs fields passed through **kwargs (those the project uses)
    "load_format", "distributed_executor_backend", "enable_sleep_mode", "logprobs_mode", "max_model_len",
    "max_num_seqs", "generation_config", "disable_log_stats",
}
_DTYPES = {"auto": None, "half": torch.float16, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float": torch.float32, "float32": torch.float32}
_LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
_TAGS = ("weights", "kv_cache", "scheduling")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if self.n != 1:
            raise ValueError("the double samples n=1 only")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k not in (0, -1):
            raise ValueError("the double implements top_k=0 (no cut) only")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative, got {self.logprobs}.")
        if isinstance(self.stop, str):
            self.stop = [self.stop]


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class _LoadableModel:
    """What ``apply_model`` hands its function: the engine's model, with vLLM's ``load_weights``."""

    def __init__(self, engine: "LLM") -> None:
        self._engine = engine

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self._engine.model.named_parameters())
        loaded = set()
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"load_weights: the model has no parameter {name!r}")
                if tuple(tensor.shape) != tuple(params[name].shape):
                    raise ValueError(f"load_weights: {name} has shape {tuple(tensor.shape)}, the model's is "
                                     f"{tuple(params[name].shape)}")
                params[name].copy_(tensor.to(params[name].dtype))
                loaded.add(name)
        self._engine._garbage -= loaded
        self._engine._record("load_weights", names=sorted(loaded))
        return loaded

    def named_parameters(self):
        return self._engine.model.named_parameters()


class LLM:
    instances: list["LLM"] = []
    log: list[tuple[int, str, dict[str, Any]]] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = set(kwargs) - _LLM_KEYWORDS
        if unknown:
            raise TypeError(f"LLM got unexpected keyword arguments {sorted(unknown)}")
        self.kwargs = dict(kwargs, model=model)
        folder = Path(model)
        if not (folder / "config.json").is_file():
            raise OSError(f"{model} holds no config.json")
        gmu = kwargs.get("gpu_memory_utilization", 0.92)
        if not 0 < gmu <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gmu}")
        kv = kwargs.get("kv_cache_memory_bytes")
        if kv is not None and (not isinstance(kv, int) or kv <= 0):
            raise ValueError(f"kv_cache_memory_bytes must be a positive int, got {kv!r}")
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if self.logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode={self.logprobs_mode!r}: expected one of {_LOGPROBS_MODES}")
        if kwargs.get("distributed_executor_backend") == "external_launcher":
            missing = [v for v in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
            if missing:
                raise KeyError(f"external_launcher needs {missing} in the environment")
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
                raise AssertionError("To get deterministic execution, please set VLLM_ENABLE_V1_MULTIPROCESSING=0")
        if kwargs.get("dtype", "auto") not in _DTYPES:
            raise ValueError(f"dtype={kwargs.get('dtype')!r}")
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config = AutoConfig.from_pretrained(folder, trust_remote_code=kwargs.get("trust_remote_code", False))
        dtype = _DTYPES[kwargs.get("dtype", "auto")] or torch.float32
        self.model = AutoModelForCausalLM.from_config(config, torch_dtype=dtype).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs.get("tokenizer") or folder)
        self.max_model_len = int(kwargs.get("max_model_len") or getattr(config, "max_position_embeddings", 2048))
        self.seed = int(kwargs.get("seed", 0))
        self.sleep_mode = bool(kwargs.get("enable_sleep_mode", False))
        eos = config.eos_token_id if config.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set([eos] if isinstance(eos, int) else list(eos or []))
        # parameters holding garbage (after a level-2 sleep, until reloaded); vLLM's memory states
        self._garbage: set[str] = set()
        self.weights_resident, self.kv_resident, self.paused = True, True, False
        self._requests = 0
        self._record("init", seed=self.seed, kwargs={k: v for k, v in self.kwargs.items() if k not in ("model", "tokenizer")})
        LLM.instances.append(self)

    # ------------------------------------------------------------------ sleep mode
    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.sleep_mode:
            raise AssertionError("Sleep mode is not enabled (enable_sleep_mode=True)")
        if level not in (0, 1, 2):
            raise ValueError(f"sleep level {level}")
        self.paused = True
        if level >= 1:
            self.kv_resident = False
            self.weights_resident = False
        if level == 2:
            self._garbage = {name for name, _ in self.model.named_parameters()}
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))
        self._record("sleep", level=level)

    def release_kv_cache_memory(self) -> None:
        if not (self.paused and self._requests == 0):
            raise RuntimeError("release_kv_cache_memory() requires a completed pause first")
        if not (self.weights_resident and self.kv_resident):
            raise RuntimeError("release_kv_cache_memory() requires all executor memory to be resident")
        self.kv_resident = False
        self._record("release_kv_cache_memory")

    def wake_up(self, tags: list[str] | None = None) -> bool:
        if tags is not None and (not tags or any(t not in _TAGS for t in tags)):
            raise ValueError(f"wake_up tags {tags}: expected a subset of {_TAGS}")
        if tags is None or "weights" in tags:
            self.weights_resident = True
        if tags is None or "kv_cache" in tags:
            self.kv_resident = True
        fully = self.weights_resident and self.kv_resident
        if fully:
            self.paused = False
        self._record("wake_up", tags=tags, fully_awake=fully)
        return fully

    def is_sleeping(self) -> bool:
        return self.paused or not (self.weights_resident and self.kv_resident)

    # ------------------------------------------------------------------ weights
    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]:
        if not self.weights_resident:
            raise RuntimeError("apply_model while the weights are asleep (wake_up(tags=['weights']) first)")
        return [func(_LoadableModel(self))]

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Any, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = True, **unused: Any) -> list[RequestOutput]:
        if unused:
            raise TypeError(f"generate got unexpected keyword arguments {sorted(unused)}")
        if self.is_sleeping():
            raise RuntimeError("generate while the engine sleeps (its scheduler is paused)")
        if self._garbage:
            raise RuntimeError(f"generate after sleep(level=2) with {len(self._garbage)} parameters never reloaded "
                               "(vLLM would sample from garbage)")
        prompts = list(prompts) if isinstance(prompts, (list, tuple)) else [prompts]
        if isinstance(sampling_params, (list, tuple)):
            params = list(sampling_params)
        else:
            params = [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        self._record("generate", n=len(prompts), seeds=[p.seed for p in params])
        outputs = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
                raise TypeError("the double takes token prompts: {'prompt_token_ids': [...]}")
            ids = [int(t) for t in prompt["prompt_token_ids"]]
            if not ids or max(ids) >= self.model.config.vocab_size or min(ids) < 0:
                raise ValueError("prompt token ids out of the vocabulary")
            if len(ids) >= self.max_model_len:
                raise ValueError(f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of "
                                 f"{self.max_model_len}.")
            outputs.append(RequestOutput(str(len(LLM.log) * 1000 + i), None, ids, [self._sample(ids, sp)]))
        return outputs

    def _sample(self, prompt: list[int], sp: SamplingParams) -> CompletionOutput:
        gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else self.seed + len(LLM.log))
        ids, out, logprobs = list(prompt), [], []
        budget = min(sp.max_tokens or self.max_model_len, self.max_model_len - len(prompt))
        finish, stop_reason, text = "length", None, ""
        with torch.no_grad():
            for _ in range(budget):
                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                raw = torch.log_softmax(logits, -1)
                if sp.temperature < 1e-5:  # vLLM's greedy threshold
                    token = int(torch.argmax(logits))
                    processed = raw
                else:
                    scaled = logits / sp.temperature
                    if sp.top_p < 1.0:
                        order = torch.argsort(scaled, descending=True)
                        cum = torch.cumsum(torch.softmax(scaled[order], -1), -1)
                        # keep the smallest prefix whose mass reaches top_p (the first token always)
                        cut = cum - torch.softmax(scaled[order], -1) >= sp.top_p
                        scaled = scaled.clone()
                        scaled[order[cut]] = float("-inf")
                    processed = torch.log_softmax(scaled, -1)
                    token = int(torch.multinomial(processed.exp(), 1, generator=gen))
                ids.append(token)
                out.append(token)
                chosen = processed if self.logprobs_mode.startswith("processed") else raw
                logprobs.append({token: Logprob(float(chosen[token]), 1, None)})
                if token in self.eos_ids and not sp.ignore_eos:
                    finish = "stop"
                    text = self.tokenizer.decode(out, skip_special_tokens=sp.skip_special_tokens)
                    break
                text = self.tokenizer.decode(out, skip_special_tokens=sp.skip_special_tokens)
                hit = next((s for s in (sp.stop or []) if s in text), None)
                if hit is not None:
                    finish, stop_reason = "stop", hit
                    text = text[: text.index(hit)] + (hit if sp.include_stop_str_in_output else "")
                    break
        return CompletionOutput(0, text, out, sum(float(next(iter(d.values())).logprob) for d in logprobs),
                                logprobs if sp.logprobs is not None else None, finish, stop_reason)

    # ------------------------------------------------------------------ the call log
    def _record(self, call: str, **details: Any) -> None:
        entry = (id(self), call, details)
        LLM.log.append(entry)
        path = os.environ.get("KX_VLLM_DOUBLE_LOG")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"engine": id(self), "call": call, **details}, default=str) + "\n")


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
