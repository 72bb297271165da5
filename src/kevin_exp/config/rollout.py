"""The ``rollout`` group: how responses are generated (hf, scripted or a vLLM engine) and scheduled."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from kevin_exp.settings_checks import auto_or_integer, choice, number


@dataclass
class VLLMConfig:
    """The vLLM engine of ``rollout.backend=vllm``: one engine per rank, in the rank's own process (vLLM's
    external-launcher executor), asleep while the learner trains (docs/vllm.md)."""

    # GPUs one engine's weights are split over (1: each rank's engine holds the whole model)
    tensor_parallel_size: int = number(1, ge=1)
    # the engine's memory: a share of the GPU's total (weights, activations and KV cache; it must be free when
    # the engine starts, which is before the learner is built) ...
    gpu_memory_utilization: Optional[float] = number(0.35, gt=0, lt=1)
    # ... or an explicit KV-cache size in bytes (then gpu_memory_utilization must be null)
    kv_cache_memory_bytes: Optional[int] = number(None, gt=0)
    # longest prompt + response the engine accepts (null: rollout.max_prompt_tokens + rollout.max_new_tokens)
    max_model_len: Optional[int] = number(None, ge=1)
    # sequences the engine schedules at once
    max_num_seqs: int = number(256, ge=1)
    # no CUDA graphs (faster start, slower decoding)
    enforce_eager: bool = False


@dataclass
class RolloutConfig:
    # generation backend: hf (transformers generate on the learner's own model); vllm (a vLLM engine per rank,
    # the `vllm` extra); scripted (answers from a script: built-in solutions, a broken build, prose; smoke runs
    # whose model cannot write kernels)
    backend: str = choice("hf", ("hf", "scripted", "vllm"))
    max_new_tokens: int = number(192, ge=1)
    # prompt budget in tokens: the earliest attempts are dropped to fit (Kevin App. D)
    max_prompt_tokens: int = number(3072, ge=1)
    # Kevin section 3.3: 0.9 for training and inference; the learner scores tokens under the same
    # temperature and top_p they were sampled with
    temperature: float = number(0.9, gt=0)
    top_p: float = number(1.0, gt=0, le=1)
    # strings that end a response (kept in its tokens, cut from its text); EOS always ends one
    stop: list[str] = field(default_factory=list)
    # backend=hf: sequences per generate() call, at most ... (auto: as many as the KV cache the resource check
    # leaves on a GPU can hold at the configured lengths, up to a rank's sequences of a turn; 16 without a GPU)
    generation_batch_size: Any = auto_or_integer(16, ge=1)
    # ... and padded tokens (rows x (longest prompt + max_new_tokens)) per call, prompts grouped by length
    # (0: no token limit)
    generation_batch_tokens: int = number(0, ge=0)
    # backend=hf: a static KV cache and a compiled decoding step (CUDA graphs on a GPU)
    compile: bool = False
    # pipeline: each trajectory's next turn is generated as soon as its verdict is in (generation overlaps
    # evaluation); halves: one half of the step's tasks is evaluated while the other half is generated; barrier:
    # every turn waits for all its verdicts (kevin_exp/rollout/loop.py)
    schedule: str = choice("pipeline", ("pipeline", "halves", "barrier"))
    # environment: kernel (the real evaluator) or synthetic (a compile-free reward, for tests)
    env: str = choice("kernel", ("kernel", "synthetic"))
    # 1: the next step's rollouts (generation and evaluation) run while this step trains, sampled with the
    # weights from before this step's update: one policy version behind, recorded per step as policy_staleness
    # (docs/async-steps.md says when that is safe); 0: each step's rollouts use that step's weights
    async_steps: int = number(0, ge=0)
    # backend=scripted: tokens of reasoning-like prose before each answer, so responses are as long as a reasoning
    # model's (scale and memory runs of the paper's shape with a model that cannot write kernels); < max_new_tokens
    scripted_think_tokens: int = number(0, ge=0)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        if self.backend == "scripted" and self.env != "kernel":
            problems.append(f"{prefix}backend=scripted answers with kernels: it needs {prefix}env=kernel, not {self.env}")
        if self.scripted_think_tokens and self.backend != "scripted":
            problems.append(f"{prefix}scripted_think_tokens={self.scripted_think_tokens}: a setting of the scripted "
                            f"backend, but {prefix}backend={self.backend}; leave it out")
        elif self.scripted_think_tokens >= self.max_new_tokens:
            problems.append(f"{prefix}scripted_think_tokens={self.scripted_think_tokens}: must leave room for the "
                            f"answer within {prefix}max_new_tokens={self.max_new_tokens}; raise max_new_tokens or "
                            f"lower it")
        if self.compile and self.backend != "hf":
            problems.append(f"{prefix}compile=true: a setting of the hf backend, but {prefix}backend={self.backend}; "
                            f"leave it out")
        if any(not s for s in self.stop):
            problems.append(f"{prefix}stop={list(self.stop)}: an empty stop string would end every response")
        if self.async_steps > 1:
            problems.append(f"{prefix}async_steps={self.async_steps}: not implemented; rollouts run at most one step "
                            f"ahead ({prefix}async_steps=1) or with their own step (0)")
        if self.async_steps and self.backend == "vllm":
            problems.append(f"{prefix}async_steps={self.async_steps}: not implemented with {prefix}backend=vllm (its engine "
                            f"sleeps while the learner trains, giving it the GPU's memory); use {prefix}backend=hf or 0")
        if self.backend == "vllm":
            problems += self._vllm_checks(prefix + "vllm.")
        return problems

    def _vllm_checks(self, prefix: str) -> list[str]:
        v, problems = self.vllm, []
        if not _vllm_installed():
            problems.append(f"{prefix[:-len('vllm.')]}backend=vllm: vLLM is not installed; pip install -e '.[vllm]' "
                            f"(vllm=={VLLM_VERSION}, on a machine with a CUDA GPU)")
        if (v.gpu_memory_utilization is None) == (v.kv_cache_memory_bytes is None):
            problems.append(f"{prefix}gpu_memory_utilization={v.gpu_memory_utilization} and {prefix}kv_cache_memory_bytes="
                            f"{v.kv_cache_memory_bytes}: set exactly one of them (the other null)")
        if v.tensor_parallel_size > 1:
            problems.append(f"{prefix}tensor_parallel_size={v.tensor_parallel_size}: not implemented yet (engines of "
                            f"several ranks must generate the same prompts); implemented: 1")
        if v.max_model_len is not None and v.max_model_len < self.max_prompt_tokens + self.max_new_tokens:
            problems.append(f"{prefix}max_model_len={v.max_model_len}: shorter than {prefix[:-len('vllm.')]}max_prompt_tokens"
                            f" + max_new_tokens = {self.max_prompt_tokens + self.max_new_tokens}; raise it or leave it null")
        return problems


# the vLLM release the `vllm` extra pins (its torch and transformers pins are within the project's)
VLLM_VERSION = "0.33.0"


def _vllm_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False
