"""How many distinct candidates the box can build per minute, builds alone, at each concurrency.

    python benchmarks/compile_capacity.py --backend cuda --n 48 --concurrency 1,8,12,16

No candidate is run: this is the ceiling that compiling puts on the evaluator's throughput (a candidate
is judged no faster than it is built). Candidates are the built-in suite's solutions made distinct (as
in ``eval_throughput.py``); the lean headers, PCHs and the op watch are built once beforehand, not
timed, and neither are the binding objects and PCHs the suite's first builds make (one round of
distinct builds, one per problem, comes first). Per concurrency level it prints the builds per minute over the level's wall time, the median
wall time of one build, the compilers' CPU-seconds per build, and the share of the box's CPU time
that was busy while the level ran (from /proc/stat: near 100% the cores are the limit).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eval_throughput import box_cpu_times, distinct_items

from kevin_exp.bench import CheckRules
from kevin_exp.bench.build.builder import Builder
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.spec import ExtensionSpec
from kevin_exp.tasks import load_builtin


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def specs_of(backend: str, n: int, tag: str) -> list[ExtensionSpec]:
    specs = []
    for item in distinct_items(backend, n, tag):
        parsed, violations = check_candidate(item.candidate, backend, CheckRules())
        assert not violations, violations
        specs += parsed.specs
    return specs


def level(builder: Builder, specs: list[ExtensionSpec], workers: int) -> dict:
    def one(spec: ExtensionSpec) -> float:
        t0 = time.perf_counter()
        res = builder.build(spec)
        assert not res.cached, "a distinct candidate was served from the cache"
        return time.perf_counter() - t0

    busy0, total0 = box_cpu_times()
    c0, t0 = children_cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        walls = list(pool.map(one, specs))
    wall = time.perf_counter() - t0
    busy1, total1 = box_cpu_times()
    return {"workers": workers, "builds": len(specs), "wall_s": wall, "per_min": 60 * len(specs) / wall,
            "median_build_s": statistics.median(walls), "cpu_per_build_s": (children_cpu_s() - c0) / len(specs),
            "box_busy": (busy1 - busy0) / max(1, total1 - total0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n", type=int, default=16, help="distinct candidates built at each concurrency")
    parser.add_argument("--concurrency", default="1,2", help="comma-separated numbers of builds at a time")
    parser.add_argument("--cuda-arch", default=None, help="e.g. 9.0a; default: the visible GPU's")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    if any(k < 1 for k in levels) or args.n < 1:
        parser.error("--n and every --concurrency value must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="kx-capacity-") as cache:
        builder = Builder(Path(cache), backend=args.backend, cuda_arch=args.cuda_arch)
        t0 = time.perf_counter()
        builder.warm()
        level(builder, specs_of(args.backend, len(load_builtin()), "capacity-warm"), max(levels))
        print(f"{args.backend}, {os.cpu_count()} cores; one-time warm-up and first round {time.perf_counter() - t0:.1f} s", flush=True)
        for k in levels:
            row = level(builder, specs_of(args.backend, args.n, f"capacity-{k}"), k)
            rows.append(row)
            print(f"  {k} at a time: {row['builds']} builds in {row['wall_s']:.1f} s", flush=True)
    print("| builds at a time | builds | wall s | builds / min | median build s | CPU-s per build | box CPU busy |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['builds']} | {r['wall_s']:.1f} | **{r['per_min']:.1f}** | "
              f"{r['median_build_s']:.2f} | {r['cpu_per_build_s']:.2f} | {100 * r['box_busy']:.0f}% |")


if __name__ == "__main__":
    main()
