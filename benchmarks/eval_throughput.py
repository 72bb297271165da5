"""Distinct correct candidates fully evaluated per minute (cold compile + checks + timing).

    python benchmarks/eval_throughput.py --backend cuda --n 32 [--torch-n 8] [--standby K] [--run-cores 0,-1]
        [--compile-workers 0,8]

Candidates are the built-in suite's reference solutions, each made distinct by a unique comment so
nothing is served from the compile cache. Each run uses a fresh cache directory, so the one-time
precompiled-header build is included in the fast path's wall time and reported separately. With
``--torch-n`` the same is measured for torch's default ``load_inline`` build path. "worker wait" is the
part of a run stage spent waiting for a standby worker to finish starting (the phase ``runner_ready_s``): when
it dominates, worker start-up bounds throughput, not compiles or the GPU. "run stage busy" is the share of the
time from the first verdict to the last in which the run slot was running a candidate: near 100% the serial run
stage bounds throughput, well below it the compiles do. "box CPU busy" is the share of all cores' time that was
busy over the run (from /proc/stat): near 100% the cores bound it; ``compile_capacity.py`` gives the builds per
minute the box manages alone.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

from kevin_exp.bench import BenchConfig, Status, Verdict
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.tasks import load_builtin


def distinct_items(backend: str, n: int, tag: str) -> list[EvalItem]:
    problems = [p for p in load_builtin() if p.solution(backend)]
    items = []
    for k in range(n):
        p = problems[k % len(problems)]
        marker = f"// {tag} variant {k}\n"
        source = p.solution(backend).replace('r"""\n', 'r"""\n' + marker, 1)
        if marker not in source:
            source = source.replace('"""\n', '"""\n' + marker, 1)
        items.append(EvalItem(f"{p.problem_id}#{k}", p.source, source))
    return items


def box_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def worker_wait_s(v: Verdict) -> float:
    return float((v.extra.get("phases") or {}).get("runner_ready_s", 0.0))


def median_phases(verdicts: list[Verdict]) -> dict[str, float]:
    """Median seconds of each stage inside the worker (load, construct, correctness, timing, re-check)."""
    phases = [v.extra["phases"] for v in verdicts if v.extra.get("phases")]
    names = sorted({k for p in phases for k in p})
    return {k: round(sorted(p.get(k, 0.0) for p in phases)[len(phases) // 2], 3) for k in names}


def by_problem(verdicts: list[Verdict]) -> dict[str, dict[str, float]]:
    """Per problem: candidates, median run stage and its main parts, and how many runs were measured again
    (a hidden-time remeasure or a recheck of a high speedup runs the candidate a second time)."""
    groups: dict[str, list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault(v.problem_id.split("#")[0], []).append(v)
    out = {}
    for problem, vs in sorted(groups.items()):
        row = {"n": len(vs), "run_s": sorted(v.run_s for v in vs)[len(vs) // 2],
               "again": sum(1 for v in vs if v.extra.get("remeasured") or v.extra.get("recheck"))}
        for phase in ("reference_s", "device_quiet_wait_s", "calibrate_s", "trials_s"):
            row[phase] = sorted((v.extra.get("phases") or {}).get(phase, 0.0) for v in vs)[len(vs) // 2]
        out[problem] = row
    return out


def run(backend: str, n: int, mode: str, tag: str, standby: int, worker_start: str = "fork", run_cores: int = -1,
        compile_workers: int = 0) -> dict:
    with tempfile.TemporaryDirectory(prefix="kx-throughput-") as cache:
        config = BenchConfig(backend=backend, build_mode=mode, cache_dir=Path(cache), standby_workers=standby,
                             worker_start=worker_start, run_cores=run_cores, compile_workers=compile_workers)
        with Evaluator(config) as ev:
            runners = ev.fork_server.describe() if ev.fork_server is not None else "exec"
            cores = ev.cpu_split.describe()
            workers = ev._compile_pool._max_workers
            print(f"{mode}, run_cores={run_cores}, compile workers {workers}: {cores}", flush=True)
            n_standby = ev._slots[0].n_standby
            t0 = time.perf_counter()
            ev.builder.warm()
            warm_s = time.perf_counter() - t0
            items = distinct_items(backend, n, tag)
            busy0, total0 = box_cpu_times()
            t1 = time.perf_counter()
            done, landed = [], []

            def progress(v: Verdict) -> None:
                done.append(v)
                landed.append(time.perf_counter() - t1)
                print(f"  {mode} {len(done)}/{n} at {time.perf_counter() - t1:6.1f} s: {v.problem_id} {v.status.value}, "
                      f"compile {v.compile_s:.1f} s, run {v.run_s:.1f} s (worker wait {worker_wait_s(v):.1f} s)", flush=True)

            verdicts = ev.evaluate(items, on_verdict=progress)
            wall = time.perf_counter() - t1
            busy1, total1 = box_cpu_times()
    counts = Counter(v.status.value for v in verdicts)
    ok = counts.get(Status.OK.value, 0)
    compile_s = sorted(v.compile_s for v in verdicts if v.compile_s)
    return {
        "mode": mode,
        "runners": runners,
        "run_cores": run_cores,
        "compile_workers": workers,
        "cores": cores,
        "first_s": landed[0] if landed else 0.0,
        # the run stages' sum over the time from the first run's start to the last verdict (one slot)
        "busy_share": sum(v.run_s for v in verdicts) / (landed[-1] - landed[0] + done[0].run_s) if len(landed) > 1 else 0.0,
        # the rate once the pipeline is full: verdicts after the first 16 over the time they took
        "steady_per_min": 60.0 * (len(landed) - 16) / (landed[-1] - landed[15]) if len(landed) > 17 else 0.0,
        "box_busy": (busy1 - busy0) / max(1, total1 - total0),
        "n": n,
        "standby": n_standby,
        "ok": ok,
        "statuses": dict(counts),
        "warm_s": warm_s,
        "wall_s": wall,
        "per_min": 60.0 * ok / wall if wall else 0.0,
        "median_compile_s": compile_s[len(compile_s) // 2] if compile_s else 0.0,
        "median_run_s": sorted(v.run_s for v in verdicts)[len(verdicts) // 2],
        "median_wait_s": sorted(worker_wait_s(v) for v in verdicts)[len(verdicts) // 2],
        "median_phases_s": median_phases(verdicts),
        "by_problem": by_problem(verdicts),
        "slowest": [(v.problem_id, v.run_s, v.extra.get("phases") or {}) for v in sorted(verdicts, key=lambda v: -v.run_s)[:5]],
        "failures": {v.problem_id: v.reason for v in verdicts if v.status is not Status.OK},
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--torch-n", type=int, default=0, help="also measure torch's default build path on this many")
    parser.add_argument("--standby", type=int, default=0, help="standby workers per run slot (0: the evaluator's default)")
    parser.add_argument("--run-cores", default="0",
                        help="evaluator.run_cores, comma-separated for one run each (e.g. 0,-1: none reserved, then auto)")
    parser.add_argument("--compile-workers", default="0",
                        help="evaluator.compile_workers, comma-separated for one run each (0: the evaluator's default)")
    parser.add_argument("--worker-start", choices=("fork", "exec", "both"), default="fork",
                        help="how runners start (evaluator.worker_start); both: one run each way")
    args = parser.parse_args()
    tag = f"{time.time_ns()}"
    ways = ["exec", "fork"] if args.worker_start == "both" else [args.worker_start]
    rows = [run(args.backend, args.n, "fast", f"{tag}{how}{rc}w{cw}", args.standby, how, int(rc), int(cw))
            for cw in args.compile_workers.split(",") for rc in args.run_cores.split(",") for how in ways]
    if args.torch_n:
        rows.append(run(args.backend, args.torch_n, "torch", tag + "t", args.standby, ways[-1]))
    print("| backend | build path | runners start by | run_cores | compile workers | standby workers | candidates | ok "
          "| one-time warm-up s | wall s | correct candidates / min | after the first 16, / min | first verdict s "
          "| run stage busy | box CPU busy | median compile s | median run s | median worker wait s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {args.backend} | {r['mode']} | {r['runners']} | {r['run_cores']} | {r['compile_workers']} | {r['standby']} | "
            f"{r['n']} | {r['ok']} | {r['warm_s']:.1f} | {r['wall_s']:.1f} | {r['per_min']:.1f} | {r['steady_per_min']:.1f} | "
            f"{r['first_s']:.1f} | {100 * r['busy_share']:.0f}% | {100 * r['box_busy']:.0f}% | "
            f"{r['median_compile_s']:.1f} | {r['median_run_s']:.2f} | "
            f"{r['median_wait_s']:.2f} |"
        )
    for r in rows:
        print(f"{r['mode']}, run_cores={r['run_cores']}: {r['cores']}")
    for r in rows:
        print(f"\n{r['mode']}, run_cores={r['run_cores']}: median worker stages (s): {r['median_phases_s']}")
    for r in rows:
        print(f"\n{r['mode']}, run_cores={r['run_cores']}, compile workers {r['compile_workers']}: by problem (medians, s)")
        print("| problem | candidates | run | reference | waiting for a quiet device | calibration | trials | run again |")
        print("|---|---|---|---|---|---|---|---|")
        for problem, row in r["by_problem"].items():
            print(f"| {problem} | {row['n']} | {row['run_s']:.2f} | {row['reference_s']:.3f} | {row['device_quiet_wait_s']:.3f} "
                  f"| {row['calibrate_s']:.3f} | {row['trials_s']:.3f} | {row['again']} |")
    for r in rows:
        print(f"\n{r['mode']}, run_cores={r['run_cores']}, compile workers {r['compile_workers']}: the slowest runs")
        for problem, run_s, phases in r["slowest"]:
            print(f"  {problem}: {run_s:.2f} s {phases}")
    for r in rows:
        if r["failures"]:
            print(f"\n{r['mode']} failures: {r['failures']}")
    torch_rows = [r for r in rows if r["mode"] == "torch"]
    if torch_rows and torch_rows[0]["per_min"]:
        print(f"\nthroughput ratio fast/torch: {rows[-2]['per_min'] / torch_rows[0]['per_min']:.1f}x")


if __name__ == "__main__":
    main()
