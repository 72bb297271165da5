"""How much a user-visible speedup moves between evaluations of the same honest kernel.

    python benchmarks/timing_fidelity.py --backend cuda --repeats 4 --out fidelity.json [--clear-ref-cache] [--mixed]

Every built-in problem with a solution for the backend is evaluated ``--repeats`` times, each repeat in a
fresh ``Evaluator`` (fresh reference process and runners, fresh secret seeds). With ``--mixed`` all repeats go
in one batch of one ``Evaluator``, each repeat's sources made distinct by a comment so that each builds on its
own: runs then happen while other candidates compile, as in a training step. The reference's timing is
cached on disk across evaluations (that is how the evaluator runs), so by default the spread is the
candidate's timing noise as a user sees it; ``--clear-ref-cache`` clears that cache before each repeat, so
the reference's own run-to-run variance is included too. Prints each problem's speedups and spread
(max/min - 1), the median and max spread, and writes them as JSON to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from kevin_exp.bench import BenchConfig, Status
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.bench.reference_process import ReferenceTimings
from kevin_exp.tasks import load_builtin


def spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if values and min(values) > 0 else float("inf")


def distinct(source: str, r: int) -> str:
    """The candidate with a comment in its first native source, so that each repeat has its own build."""
    return source.replace("#include", f"// fidelity repeat {r}\n#include", 1)


def record(verdicts: list, label: str, speedups: dict, ref_ms: dict, timings: dict, failures: dict) -> None:
    for v in verdicts:
        if v.status is Status.OK:
            speedups[v.problem_id].append(v.speedup)
            stats = v.runtime_stats
            timings[v.problem_id].append({**v.extra.get("timing", {}), "phases": v.extra.get("phases", {}),
                                          "reference": v.extra.get("reference", {}),
                                          **({"min_ms": stats.min_ms, "p25_ms": stats.p25_ms, "p75_ms": stats.p75_ms,
                                              "max_ms": stats.max_ms} if stats else {})})
            ref_ms[v.problem_id].append(v.ref_runtime_ms)
        else:
            failures.setdefault(v.problem_id, []).append(f"{label}: {v.status.value}: {v.reason[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--clear-ref-cache", action="store_true", help="clear the reference-timing cache before each repeat")
    parser.add_argument("--cache-dir", type=Path, default=None, help="compile and reference-timing cache (default: a fresh one)")
    parser.add_argument("--timed-trials", type=int, default=BenchConfig.timed_trials)
    parser.add_argument("--run-cores", type=int, default=0, help="evaluator.run_cores (0 none, -1 auto)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N problems (0: all)")
    parser.add_argument("--mixed", action="store_true", help="every repeat in one batch, each built on its own")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="kx-fidelity-"))
    problems = [p for p in load_builtin() if p.solution(args.backend)][: args.limit or None]
    items = [EvalItem(p.problem_id, p.source, p.solution(args.backend)) for p in problems]
    config = BenchConfig(backend=args.backend, cache_dir=cache_dir, timed_trials=args.timed_trials,
                         run_cores=args.run_cores)
    print(f"run_cores={args.run_cores}", flush=True)
    speedups: dict[str, list[float]] = {p.problem_id: [] for p in problems}
    ref_ms: dict[str, list[float]] = {p.problem_id: [] for p in problems}
    # per repeat: which time the verdict used, the reported samples' spread, the run's stages (to see where the
    # drift between evaluations is: the kernel's own time, the outside bound, or the path around the call)
    timings: dict[str, list[dict]] = {p.problem_id: [] for p in problems}
    failures: dict[str, list[str]] = {}
    repeat_s = []
    if args.mixed:
        t0 = time.perf_counter()
        batch = [EvalItem(it.problem_id, it.reference, distinct(it.candidate, r))
                 for r in range(args.repeats) for it in items]
        with Evaluator(config) as ev:
            verdicts = ev.evaluate(batch)
        repeat_s.append(round(time.perf_counter() - t0, 2))
        print(f"one mixed batch of {len(batch)}: {repeat_s[-1]} s", flush=True)
        record(verdicts, "mixed", speedups, ref_ms, timings, failures)
    for r in range(0 if args.mixed else args.repeats):
        if args.clear_ref_cache:
            ReferenceTimings(cache_dir).clear()
        t0 = time.perf_counter()
        with Evaluator(config) as ev:
            verdicts = ev.evaluate(items)
        repeat_s.append(round(time.perf_counter() - t0, 2))
        record(verdicts, f"repeat {r + 1}", speedups, ref_ms, timings, failures)
        print(f"repeat {r + 1}/{args.repeats}: {repeat_s[-1]} s", flush=True)

    rows = {pid: {"speedups": s, "ref_ms": ref_ms[pid], "spread": spread(s) if len(s) > 1 else None,
                  "timing": timings[pid]} for pid, s in speedups.items()}
    spreads = [row["spread"] for row in rows.values() if row["spread"] is not None]
    summary = {
        "backend": args.backend, "repeats": args.repeats, "clear_ref_cache": args.clear_ref_cache,
        "timed_trials": args.timed_trials, "mixed": args.mixed, "problems": rows, "failures": failures, "repeat_s": repeat_s,
        "median_spread": statistics.median(spreads) if spreads else None, "max_spread": max(spreads) if spreads else None,
    }
    width = max(len(pid) for pid in rows)
    for pid, row in rows.items():
        text = " ".join(f"{x:.3f}" for x in row["speedups"])
        sp = "-" if row["spread"] is None else f"{100 * row['spread']:.1f}%"
        print(f"{pid:<{width}}  spread {sp:>7}  speedups {text}")
    if spreads:
        print(f"median spread {100 * summary['median_spread']:.1f}%, max {100 * summary['max_spread']:.1f}% "
              f"over {len(spreads)} problems")
    for pid, why in failures.items():
        print(f"FAILED {pid}: {why}")
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
