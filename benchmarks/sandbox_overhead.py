"""What the compile sandbox costs: one compiler process (`true`) started through ``proc.run`` with and without
the sandbox (launcher, namespaces, minimal root, uid lease), then cold CPU builds of small distinct extensions
alternating between the two. Needs Linux and root for the sandboxed side.

    python benchmarks/sandbox_overhead.py --builds 4
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from kevin_exp.bench.build import proc
from kevin_exp.bench.build.builder import Builder
from kevin_exp.bench.spec import ExtensionSpec

SRC = ("torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); float* o = y.data_ptr<float>(); "
       "const float* i = x.data_ptr<float>(); for (int64_t k = 0; k < x.numel(); ++k) o[k] = i[k] * 2.f; return y; }\n")


def force(on: bool) -> None:
    proc._jail_state.clear()
    proc._jail_state.update(on=on, note="forced by the benchmark")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spawns", type=int, default=20)
    parser.add_argument("--builds", type=int, default=3)
    args = parser.parse_args()
    assert proc.sandboxed(), proc.sandbox_note()
    folder = Path(tempfile.mkdtemp(prefix="kx-overhead-"))
    spawn: dict[str, list[float]] = {"plain": [], "sandboxed": []}
    for _ in range(args.spawns):
        for name, on in (("plain", False), ("sandboxed", True)):
            force(on)
            t = time.perf_counter()
            assert proc.run(["true"], folder, time.monotonic() + 30, 4.0).ok
            spawn[name].append(time.perf_counter() - t)
    force(True)
    t = time.perf_counter()
    builder = Builder(Path(tempfile.mkdtemp(prefix="kx-overhead-cache-")))
    init_s = time.perf_counter() - t
    builder.warm()
    builds: dict[str, list[float]] = {"plain": [], "sandboxed": []}
    for _ in range(args.builds):
        for name, on in (("plain", False), ("sandboxed", True)):
            force(on)
            spec = ExtensionSpec(name="f", cpp_sources=(SRC + f"// {uuid.uuid4().hex}\n",), functions=("f",))
            t = time.perf_counter()
            builder.build(spec)
            builds[name].append(time.perf_counter() - t)
    print(json.dumps({
        "one compiler process, median ms": {k: round(1000 * statistics.median(v), 1) for k, v in spawn.items()},
        "cold cpu build, median s": {k: round(statistics.median(v), 2) for k, v in builds.items()},
        "Builder() with the op watch build, s": round(init_s, 2), "op watch": builder.op_watch_note,
    }, indent=1))


if __name__ == "__main__":
    main()
