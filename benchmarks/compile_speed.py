"""Compile time of candidate extensions: the fast builder against torch's own load_inline.

Prints a Markdown table per backend: the one-time warm-up (lean headers, PCHs, common bindings),
the cold compile of N distinct small extensions in mode fast and mode torch (distinct sources, so
nothing is cached), the cache hit (lookup + import in a fresh process, after `import torch`) and
the torch/fast ratio. Each run uses a fresh temporary cache dir.

    python benchmarks/compile_speed.py --backend cpu --n 3
    python benchmarks/compile_speed.py --backend cuda --n 2      # on a GPU machine
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kevin_exp.bench.build.builder import Builder, import_extension
from kevin_exp.bench.spec import ExtensionSpec

CPU_SRC = r"""
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y) {
  TORCH_CHECK(x.sizes() == y.sizes(), "shape mismatch");
  auto xc = x.contiguous(), yc = y.contiguous();
  auto out = torch::empty_like(xc);
  const float* a = xc.data_ptr<float>(); const float* b = yc.data_ptr<float>(); float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = a[i] * SCALE + b[i];
  return out;
}
"""
CUDA_CPP = "torch::Tensor scale_add(torch::Tensor x, torch::Tensor y);"
CUDA_SRC = r"""
__global__ void scale_add_kernel(const float* a, const float* b, float* o, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) o[i] = a[i] * SCALE + b[i];
}
torch::Tensor scale_add(torch::Tensor x, torch::Tensor y) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "CUDA tensors expected");
  auto xc = x.contiguous(), yc = y.contiguous();
  auto out = torch::empty_like(xc);
  int64_t n = xc.numel();
  int threads = 256;
  int blocks = (int)((n + threads - 1) / threads);
  scale_add_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
"""

HIT_SCRIPT = r"""
import json, sys, time
import torch
t0 = time.perf_counter()
from pathlib import Path
from kevin_exp.bench.build.builder import Builder, import_extension
from kevin_exp.bench.spec import ExtensionSpec
args = json.loads(sys.argv[1])
b = Builder(Path(args["cache"]), backend=args["backend"], mode=args["mode"], cuda_arch=args["arch"])
r = b.lookup(ExtensionSpec(**args["spec"]))
assert r is not None and r.cached
import_extension(r)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def make_spec(backend: str, i: int, salt: str) -> ExtensionSpec:
    scale = f"({i + 2}.0f)"
    tag = f"\n// benchmark {salt} #{i}\n"
    if backend == "cpu":
        return ExtensionSpec(name=f"bench_{i}", cpp_sources=(CPU_SRC.replace("SCALE", scale) + tag,),
                             functions=("scale_add",), extra_cflags=("-O3",))
    return ExtensionSpec(name=f"bench_{i}", cpp_sources=(CUDA_CPP + tag,),
                         cuda_sources=(CUDA_SRC.replace("SCALE", scale),), functions=("scale_add",),
                         extra_cflags=("-O3",), extra_cuda_cflags=("-O3",))


def check(module, backend: str, i: int) -> None:
    dev = "cuda" if backend == "cuda" else "cpu"
    x, y = torch.randn(1000, device=dev), torch.randn(1000, device=dev)
    torch.testing.assert_close(module.scale_add(x, y), x * (i + 2) + y)


def hit_seconds(cache: Path, backend: str, mode: str, arch: str | None, spec: ExtensionSpec) -> float:
    payload = {"cache": str(cache), "backend": backend, "mode": mode, "arch": arch,
               "spec": {k: getattr(spec, k) for k in spec.__dataclass_fields__}}
    out = subprocess.run([sys.executable, "-c", HIT_SCRIPT, json.dumps(payload)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def run_mode(backend: str, mode: str, n: int, cache: Path, arch: str | None, jobs: int) -> dict:
    builder = Builder(cache, backend=backend, mode=mode.split("-")[0], cuda_arch=arch, jobs=jobs)
    if mode == "fast-serial":  # ablation: nvcc's own sequential steps instead of the split pipeline
        builder.fast.nvcc_pipeline = False
    row: dict = {"mode": mode, "warm": None}
    if mode == "fast":
        t = time.perf_counter()
        builder.warm()
        row["warm"] = time.perf_counter() - t
    salt = f"{time.time_ns()}-{mode}"
    cold = []
    for i in range(n):
        spec = make_spec(backend, i, salt)
        result = builder.build(spec)
        assert not result.cached
        cold.append(result.seconds)
        check(import_extension(result), backend, i)
        print(f"  {backend}/{mode} #{i}: {result.seconds:.2f} s", file=sys.stderr)
    row["cold"] = cold
    row["hit"] = hit_seconds(cache, backend, builder.mode, arch, make_spec(backend, 0, salt))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--n", type=int, default=3, help="distinct extensions per mode")
    parser.add_argument("--modes", default="fast,torch", help="comma list of fast, fast-serial, torch")
    parser.add_argument("--arch", default=None, help="CUDA arch, e.g. 9.0a (default: the visible GPU's)")
    parser.add_argument("--jobs", type=int, default=0)
    args = parser.parse_args()
    backends = ["cpu", "cuda"] if args.backend == "all" else [args.backend]
    if "cuda" in backends and not torch.cuda.is_available():
        if args.backend == "cuda":
            sys.exit("no CUDA device visible")
        backends.remove("cuda")
    print(f"torch {torch.__version__}, {args.n} distinct extensions per mode\n")
    print("| backend | mode | warm-up s (once) | cold compile s, mean (min-max) | cache hit s | torch/fast |")
    print("|---|---|---|---|---|---|")
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix="kx-compile-speed-") as tmp:
            rows = [run_mode(backend, m, args.n, Path(tmp), args.arch, args.jobs) for m in args.modes.split(",")]
        means = {r["mode"]: statistics.mean(r["cold"]) for r in rows}
        for r in rows:
            warm = f"{r['warm']:.1f}" if r["warm"] is not None else "-"
            cold = f"{means[r['mode']]:.2f} ({min(r['cold']):.2f}-{max(r['cold']):.2f})"
            ratio = f"{means['torch'] / means[r['mode']]:.1f}x" if "torch" in means and r["mode"] != "torch" else ""
            print(f"| {backend} | {r['mode']} | {warm} | {cold} | {r['hit']:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
