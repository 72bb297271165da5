"""Where an evaluated candidate's CPU time goes: its cold build (per step), its worker's start-up, its run.

    python benchmarks/eval_cost.py --backend cuda --n 6 [--workers 4]

Throughput on a box is bounded by cores x 60 / (CPU-seconds per build + per worker) candidates per minute
once the single run stage per GPU is not the bottleneck; this prints each term, one thing at a time (no
contention), from a fresh cache:
- build: the built-in suite's solutions made distinct (nothing cached), built one after the other; CPU-s are
  the compilers' user + system time, and the steps come from each build's record in the cache;
- worker start: a sandboxed worker started the evaluator's way (namespaces, uid, torch, CUDA, the guard) that
  exits once warm;
- run: the same candidates evaluated again (every build a cache hit): the run stage's wall time per candidate;
  its CPU time is about that on cuda (a synchronising process spins while the GPU works) and up to cores x
  that on cpu (the timed run uses the slot's cores).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from eval_throughput import distinct_items

from kevin_exp.bench import BenchConfig, CheckRules
from kevin_exp.bench.build import Builder, cache
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.bench.sandbox import _probe_worker, probe_policy
from kevin_exp.bench.uid_lease import UidLease


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build_costs(backend: str, items, cache_dir: Path) -> tuple[list[dict], float]:
    builder = Builder(cache_dir, backend=backend)
    t0 = time.perf_counter()
    builder.warm()
    warm_s = time.perf_counter() - t0
    rows = []
    for it in items:
        parsed, violations = check_candidate(it.candidate, backend, CheckRules())
        assert not violations, violations
        for spec in parsed.specs:
            c0, t0 = children_cpu_s(), time.perf_counter()
            res = builder.build(spec)
            meta = json.loads((cache.entry_dir(cache_dir, "ext", res.key) / "meta.json").read_text())
            rows.append({"wall_s": time.perf_counter() - t0, "cpu_s": children_cpu_s() - c0,
                         "steps": {s["step"]: s["seconds"] for s in meta.get("steps", [])}})
    return rows, warm_s


def worker_start_costs(backend: str, n: int) -> list[tuple[float, float]]:
    policy = probe_policy("auto", backend)
    out = []
    for _ in range(n):
        lease = UidLease() if policy.mode == "namespace" and policy.drop_uid else None
        c0, t0 = children_cpu_s(), time.perf_counter()
        try:
            error = _probe_worker(backend, private_tmp=policy.mode == "namespace", uid=lease.uid if lease else None)
        finally:
            if lease is not None:
                lease.release()
        assert error is None, f"the worker did not start: {error}"
        out.append((time.perf_counter() - t0, children_cpu_s() - c0))
    return out


def run_stage_s(backend: str, items, cache_dir: Path) -> list[float]:
    with Evaluator(BenchConfig(backend=backend, cache_dir=cache_dir)) as ev:
        verdicts = ev.evaluate(items)
    bad = [v.reason for v in verdicts if not v.correct]
    assert not bad, bad
    return [v.run_s for v in verdicts]


def med(values) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n", type=int, default=6, help="distinct candidates to build and run")
    parser.add_argument("--workers", type=int, default=4, help="worker start-ups to time")
    args = parser.parse_args()
    items = distinct_items(args.backend, args.n, f"cost{time.time_ns()}")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="kx-cost-") as tmp:
        builds, warm_s = build_costs(args.backend, items, Path(tmp))
        starts = worker_start_costs(args.backend, args.workers)
        run_s = med(run_stage_s(args.backend, items, Path(tmp)))
    build_cpu = med(r["cpu_s"] for r in builds)
    start_cpu = med(c for _, c in starts)
    print(f"{args.backend}, {cores} cores; one-time warm-up {warm_s:.1f} s")
    print("| what | median wall s | median CPU-s |")
    print("|---|---|---|")
    print(f"| cold build ({len(builds)}) | {med(r['wall_s'] for r in builds):.2f} | {build_cpu:.2f} |")
    print(f"| worker start, torch + CUDA + guard ({len(starts)}) | {med(w for w, _ in starts):.2f} | {start_cpu:.2f} |")
    run_cpu = run_s if args.backend == "cuda" else run_s * cores
    print(f"| run stage of a cached candidate ({len(items)}) | {run_s:.2f} | <= {run_cpu:.2f} |")
    steps = defaultdict(list)
    for r in builds:
        for name, s in r["steps"].items():
            steps[name].append(s)
    print("\nbuild steps, median wall s: " + ", ".join(f"{k} {med(v):.2f}" for k, v in steps.items()))
    per_candidate = build_cpu + start_cpu + run_cpu
    print(f"\nCPU per evaluated candidate <= {per_candidate:.1f} s (build {build_cpu:.1f} + worker start {start_cpu:.1f} + "
          f"run {run_cpu:.1f}): about {cores * 60 / per_candidate:.0f} candidates / min on {cores} cores from CPU alone")


if __name__ == "__main__":
    main()
