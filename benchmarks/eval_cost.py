"""Where an evaluated candidate's CPU time goes: its cold build (per step), its worker's start-up, its run.

    python benchmarks/eval_cost.py --backend cuda --n 6 [--workers 4]

Throughput on a box is bounded by cores x 60 / (CPU-seconds per build + per worker) candidates per minute
once the single run stage per GPU is not the bottleneck; this prints each term, one thing at a time (no
contention), from a fresh cache:
- build: the built-in suite's solutions made distinct (nothing cached), built one after the other; CPU-s are
  the compilers' user + system time, and the steps come from each build's record in the cache;
- runner start: a sandboxed runner started the evaluator's way (namespaces, uid, torch, CUDA, the guard) until it
  is warm, both ways: exec'd (a fresh interpreter imports torch) and forked from the warm fork server (the
  default); the total below counts the fork way;
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
from kevin_exp.bench.build import cache
from kevin_exp.bench.build.builder import Builder
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.bench.exchange import ALIGN, new_exchange_fd
from kevin_exp.bench.fork_client import ForkServer
from kevin_exp.bench.sandbox import probe_policy
from kevin_exp.bench.worker_process import WorkerProcess


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


def session_cpu_s(sid: int) -> float:
    """CPU seconds used so far by the live processes of session ``sid``."""
    total = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:
                total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def worker_start_costs(backend: str, n: int, how: str) -> tuple[list[tuple[float, float]], float]:
    """``n`` runners started the evaluator's way (sandbox, uid, torch, CUDA, the guard; ``how``: forked from the
    warm fork server, or exec'd), each until it reports ready, then ended: (wall s to ready, CPU-s) per runner,
    and the fork server's own one-time CPU-s (its imports). A forked runner's CPU is the server's reaped children's,
    an exec'd one's ours."""
    policy = probe_policy("auto", backend)
    out = []
    with tempfile.TemporaryDirectory(prefix="kx-start-") as tmp:
        server = ForkServer(backend, Path(tmp)) if how == "fork" else None
        if server is not None:
            assert server.ready(), server.unusable
        server_cpu = server.cpu_seconds() if server is not None else 0.0
        exchange = new_exchange_fd(ALIGN)
        try:
            for _ in range(n):
                c0 = server.cpu_seconds() if server is not None else 0.0
                t0 = time.perf_counter()
                worker = WorkerProcess(policy, backend, 0, Path(tmp), exchange, fork_server=server,
                                       cuda_device="0" if backend == "cuda" else None)
                ready = worker.wait_ready(300)
                wall = time.perf_counter() - t0
                session_cpu = session_cpu_s(worker.proc.pid)
                worker.close()
                assert isinstance(ready, dict) and ready.get("op") == "ready", (ready, worker.output_tail())
                assert worker.forked == (server is not None)
                # an exec'd runner is killed before its own parent (unshare) reaps it: its CPU is read from /proc
                out.append((wall, server.cpu_seconds() - c0 if server is not None else session_cpu))
        finally:
            os.close(exchange)
            if server is not None:
                server.close()
    return out, server_cpu


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
        starts = {how: worker_start_costs(args.backend, args.workers, how) for how in ("exec", "fork")}
        run_s = med(run_stage_s(args.backend, items, Path(tmp)))
    build_cpu = med(r["cpu_s"] for r in builds)
    start_cpu = med(c for _, c in starts["fork"][0])
    print(f"{args.backend}, {cores} cores; one-time warm-up {warm_s:.1f} s")
    print("| what | median wall s | median CPU-s |")
    print("|---|---|---|")
    print(f"| cold build ({len(builds)}) | {med(r['wall_s'] for r in builds):.2f} | {build_cpu:.2f} |")
    for how, (runs, server_cpu) in starts.items():
        once = f" (server's imports, once: {server_cpu:.2f} CPU-s)" if how == "fork" else ""
        print(f"| runner start by {how}: sandbox, torch, CUDA, guard ({len(runs)}){once} | {med(w for w, _ in runs):.2f} | "
              f"{med(c for _, c in runs):.2f} |")
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
