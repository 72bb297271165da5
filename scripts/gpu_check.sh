#!/usr/bin/env bash
# Run on a GPU machine (the image already has torch, numpy, ninja, pytest): GPU tests and GPU benchmarks.
# Logs go to $OUT (or ./gpu-logs). Usage: bash scripts/gpu_check.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}; mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# DeepSpeed's op builder cannot parse "9.0a"; the evaluator's builder takes the arch from the device anyway.
export TORCH_CUDA_ARCH_LIST=9.0
# The image's default CXX is a wrapper whose extensions crash when C++ code throws.
export CXX=/usr/bin/g++ CC=/usr/bin/gcc
export KEVIN_EXP_CACHE=${KEVIN_EXP_CACHE:-/tmp/kx-cache}
py=${PYTHON:-python3}
{ nvidia-smi -L; $py -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; nproc; } 2>&1 | tee "$out/machine.txt"
$py -m pytest -q -m gpu tests/gpu "$@" 2>&1 | tee "$out/gpu-tests.txt"
$py benchmarks/compile_speed.py --backend cuda --n 4 2>&1 | tee "$out/compile-speed.txt"
$py benchmarks/eval_throughput.py --backend cuda --n 32 --torch-n 8 2>&1 | tee "$out/throughput.txt"
