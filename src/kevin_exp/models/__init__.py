"""The policy: model + tokenizer loading (see loading.py)."""
from __future__ import annotations

from kevin_exp.models.loading import (
                                      ModelConfigError,
                                      Policy,
                                      chat_prompt_ids,
                                      check_model_path,
                                      load_policy,
                                      load_tokenizer,
                                      smollm2_cache_dir,
)

__all__ = ["ModelConfigError", "Policy", "check_model_path", "chat_prompt_ids", "load_policy", "load_tokenizer", "smollm2_cache_dir"]
