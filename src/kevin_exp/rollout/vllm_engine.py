"""``rollout.backend=vllm``: one vLLM engine per rank, colocated with the learner on the rank's GPU.

The engine runs in the rank's own process (vLLM's ``external_launcher`` executor, multiprocessing off), starts
with dummy weights before the learner fills the GPU, and goes to sleep at once. Each step then follows the
lifecycle of Kevin's colocated runs (docs/vllm.md):

    wake weights -> push the learner's weights (one tensor at a time; under ZeRO-3 each is gathered alone)
    -> wake KV cache -> generate a turn -> free the KV cache while the turn's kernels are evaluated
    -> wake KV cache -> next turn ... -> sleep fully (level 2) before the learner trains

torch's cached blocks are freed before every wake. Each transition's time and the GPU's used memory after it
are kept and handed to the step's metrics (``pop_stats``). Sampling asks vLLM for the processed log-prob of
each sampled token (``logprobs_mode="processed_logprobs"``: after temperature and top-p, the distribution the
learner scores with), so ``logprob_diff`` measures the engine/learner mismatch.

vLLM is imported lazily (the ``vllm`` extra); ``vllm_module`` lets a caller hand in another implementation of
the same surface.
"""
from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Sequence

import torch

from kevin_exp.config import ModelConfig, RolloutConfig
from kevin_exp.launch.world import DistContext, join_process_group
from kevin_exp.models import Policy
from kevin_exp.rollout.generation import Generation


def engine_seed(run_seed: int, rank: int) -> int:
    """Each rank's engine draws its own random stream."""
    return (run_seed * 1_000_003 + rank * 7_919 + 1) % (2**31 - 1)


def request_seed(seed: int, index: int) -> int:
    # a request's tokens are a function of (prompt, this seed, weights), whatever the engine batches it with
    return (seed * 65_537 + index * 104_729) % (2**31 - 1)


def engine_args(rollout: RolloutConfig, model: ModelConfig, folder: Path, seed: int) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for this run (each one a setting of the run or fixed by the design)."""
    v = rollout.vllm
    args: dict[str, Any] = dict(
        model=str(folder), tokenizer=str(folder), dtype=model.dtype, seed=seed,
        # the learner's weights are pushed before the first generation: nothing is read from disk
        load_format="dummy",
        tensor_parallel_size=v.tensor_parallel_size, distributed_executor_backend="external_launcher",
        enable_sleep_mode=True, logprobs_mode="processed_logprobs",
        max_model_len=v.max_model_len or rollout.max_prompt_tokens + rollout.max_new_tokens,
        max_num_seqs=v.max_num_seqs, enforce_eager=v.enforce_eager,
        # sampling is exactly the rollout config's: no defaults from the model's generation_config.json
        generation_config="vllm", trust_remote_code=model.trust_remote_code,
    )
    if v.kv_cache_memory_bytes is not None:
        args["kv_cache_memory_bytes"] = int(v.kv_cache_memory_bytes)
    else:
        args["gpu_memory_utilization"] = float(v.gpu_memory_utilization)
    return args


def write_engine_folder(policy: Policy, folder: Path) -> Path:
    """The model's config, generation config and tokenizer, which the engine reads (its weights are pushed)."""
    folder.mkdir(parents=True, exist_ok=True)
    policy.model.config.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return folder


class VLLMGenerator:
    owns_weights = True

    def __init__(self, rollout: RolloutConfig, model: ModelConfig, policy: Policy, ctx: DistContext, run_seed: int,
                 device: torch.device, dist_timeout_s: float, vllm_module: ModuleType | None = None) -> None:
        self.vllm = vllm_module or importlib.import_module("vllm")
        self.rollout, self.tokenizer, self.device = rollout, policy.tokenizer, device
        self.stop = list(rollout.stop)
        # the external launcher's engine joins the run's process group (made here, with the run's timeout)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        join_process_group(ctx, device, dist_timeout_s)
        self.folder = write_engine_folder(policy, Path(tempfile.mkdtemp(prefix=f"kx-vllm-rank{ctx.rank}-")))
        self.seed = engine_seed(run_seed, ctx.rank)
        self.engine_args = engine_args(rollout, model, self.folder, self.seed)
        self.stats: dict[str, float] = {}
        t0 = time.perf_counter()
        self.llm = self.vllm.LLM(**self.engine_args)
        self.start_s = time.perf_counter() - t0
        # weights dummy, KV cache allocated: give the GPU back until the first step pushes real weights
        self.llm.sleep(level=2)
        self.weights_awake, self.kv_awake, self.pushed = False, False, False

    # ------------------------------------------------------------------ the Generator protocol
    def wake(self) -> None:
        """Weights back on the GPU (their contents were discarded: a push must follow)."""
        if not self.weights_awake:
            self._transition("wake_weights", lambda: self.llm.wake_up(tags=["weights"]), free_cache=True)
            self.weights_awake, self.pushed = True, False

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads the learner's weights into the engine one tensor at a time (a ZeRO-3 learner gathers each
        alone while it is loaded)."""
        if not self.weights_awake:
            raise RuntimeError("update_weights before wake(): the engine's weights are asleep")

        def push() -> None:
            for name, tensor in named_tensors:
                self.llm.apply_model(lambda model, item=(name, tensor): model.load_weights(weights=[item]))

        self._transition("push_weights", push)
        self.pushed = True

    def sleep(self) -> None:
        """Everything off the GPU before the learner trains (level 2: weights are pushed again after)."""
        if self.weights_awake or self.kv_awake:
            self._transition("sleep", lambda: self.llm.sleep(level=2))
        self.weights_awake = self.kv_awake = self.pushed = False

    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                 seed: int, seeds: Sequence[int] | None = None,
                 trajectories: Sequence[int] | None = None) -> list[Generation]:
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds: {len(seeds)} for {len(prompts)} prompts")
        if not self.pushed:
            raise RuntimeError("generate before the learner's weights were pushed (wake(), update_weights())")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if not self.kv_awake:
            self._transition("wake_kv", lambda: self.llm.wake_up(tags=["kv_cache"]), free_cache=True)
            self.kv_awake = True
        params = [self.vllm.SamplingParams(n=1, temperature=temperature, top_p=top_p, top_k=0, max_tokens=max_new_tokens,
                                           stop=self.stop or None, logprobs=0,
                                           seed=int(seeds[i]) if seeds is not None else request_seed(seed, i),
                                           skip_special_tokens=True)
                  for i in range(len(prompts))]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        # the turn's kernels are evaluated next: their KV cache is not needed until the next turn
        self._transition("free_kv", self._free_kv)
        self.kv_awake = False
        return [self._generation(prompt, out) for prompt, out in zip(prompts, outputs)]

    def pop_stats(self) -> dict[str, float]:
        stats, self.stats = self.stats, {}
        return stats

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    # ------------------------------------------------------------------ internals
    def _free_kv(self) -> None:
        self.llm.sleep(level=0)  # pause scheduling: release_kv_cache_memory requires it
        self.llm.release_kv_cache_memory()

    def _transition(self, name: str, action, free_cache: bool = False) -> None:
        if free_cache and self.device.type == "cuda":
            torch.cuda.empty_cache()  # wakes otherwise run out of memory beside torch's cached blocks
        t0 = time.perf_counter()
        action()
        self.stats[f"vllm_{name}_s"] = self.stats.get(f"vllm_{name}_s", 0.0) + time.perf_counter() - t0
        used = _gpu_used_gb(self.device)
        if used is not None:
            key = f"vllm_{name}_gpu_used_gb"
            self.stats[key] = max(self.stats.get(key, 0.0), used)

    def _generation(self, prompt: list[int], output: Any) -> Generation:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for token, step in zip(tokens, completion.logprobs or [])]
        if len(logprobs) != len(tokens):
            raise RuntimeError(f"the engine returned {len(logprobs)} log-probs for {len(tokens)} tokens")
        return Generation(prompt_ids=list(prompt), response_ids=tokens, text=completion.text,
                          truncated=completion.finish_reason == "length", logprobs=logprobs)


def _gpu_used_gb(device: torch.device) -> float | None:
    """Memory in use on the whole GPU (vLLM's own allocator is invisible to torch's counters)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 1e9
