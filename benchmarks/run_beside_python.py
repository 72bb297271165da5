"""A run stage beside a busy Python thread in the evaluator's process (as the policy's generation is under the
``pipeline`` schedule): the run's median time quiet, beside the thread with the GIL handed over at Python's
default switch interval (5 ms), and beside it with the evaluator's 0.2 ms during runs (``bench/gil_handoff.py``).
The busy thread is kept off the run's cores, so what it takes from the run is the GIL, not a core.

    python benchmarks/run_beside_python.py --backend cpu     # CPU box (needs 2 cores)
    python benchmarks/run_beside_python.py --backend cuda    # GPU box
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from kevin_exp.bench import BenchConfig, gil_handoff
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.tasks import load_builtin


def busy(stop: threading.Event, cores: set[int]) -> None:
    os.sched_setaffinity(0, cores)
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    problem = next(p for p in load_builtin() if p.solution(args.backend))
    default_interval = sys.getswitchinterval()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kx-gil-") as cache:
        config = BenchConfig(backend=args.backend, cache_dir=Path(cache), recheck_speedup=1e9,
                             run_cores=1 if args.backend == "cpu" else 2)
        with Evaluator(config) as ev:
            if not ev.cpu_split.active:
                raise SystemExit("needs a machine where the run stage gets cores of its own (run_cores)")
            k = 0

            def runs() -> list[float]:
                nonlocal k
                out = []
                for _ in range(args.runs):
                    k += 1
                    source = problem.solution(args.backend).replace('r"""\n', f'r"""\n// run {k}\n', 1)
                    [v] = ev.evaluate([EvalItem(f"{problem.problem_id}#{k}", problem.source, source)])
                    assert v.status.value == "ok", v.reason
                    print(f"  {k}: run {v.run_s:.2f} s, compile {v.compile_s:.1f} s", flush=True)
                    out.append(v.run_s)
                return out

            runs()  # builds, times the reference, starts the runners
            rows.append(("quiet", runs()))
            for label, interval in (("beside a busy Python thread, GIL handed over at 5 ms", default_interval),
                                    ("beside a busy Python thread, 0.2 ms during runs (the evaluator's)",
                                     gil_handoff.RUN_SWITCH_INTERVAL_S)):
                stop = threading.Event()
                thread = threading.Thread(target=busy, args=(stop, set(ev.cpu_split.compiles)), daemon=True)
                gil_handoff.RUN_SWITCH_INTERVAL_S, saved = interval, gil_handoff.RUN_SWITCH_INTERVAL_S
                thread.start()
                try:
                    rows.append((label, runs()))
                finally:
                    stop.set()
                    thread.join()
                    gil_handoff.RUN_SWITCH_INTERVAL_S = saved
    print(f"{args.backend}, {problem.problem_id}, {args.runs} runs each, {ev.cpu_split.describe()}")
    print("| run stage | median run s | runs s |")
    print("|---|---|---|")
    for label, times in rows:
        print(f"| {label} | {statistics.median(times):.2f} | {', '.join(f'{t:.2f}' for t in times)} |")


if __name__ == "__main__":
    main()
