"""The policy: model + tokenizer loading (see loading.py)."""
from __future__ import annotations

from kevin_exp.models.loading import Policy, chat_prompt_ids, load_policy, load_tokenizer, smollm2_cache_dir

__all__ = ["Policy", "chat_prompt_ids", "load_policy", "load_tokenizer", "smollm2_cache_dir"]
