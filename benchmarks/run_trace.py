"""Where one candidate's run stage goes, message by message: every request the parent sends to the candidate's
runner (W) and the reference process (R), and every reply, timed by the parent; the gaps between consecutive
events, summed over the runs, largest first.

    python benchmarks/run_trace.py --backend cuda [--problems level1/1 level2/5] [--runs 3]

Each problem's solution is evaluated ``--runs`` times, made distinct by a comment (the first run builds it and
times the reference; the others are the steady state the table is taken from).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kevin_exp.bench import BenchConfig, worker_process
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.tasks import load_builtin


class Timeline:
    """Wraps ``ChildProcess.send``/``recv`` to log (time, process, direction, op)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str, str]] = []
        self.on = False
        send, recv = worker_process.ChildProcess.send, worker_process.ChildProcess.recv
        timeline = self

        def logged_send(proc: Any, message: dict[str, Any]) -> bool:
            if timeline.on:
                timeline.events.append((time.monotonic(), _who(proc), "send", str(message.get("op"))))
            return send(proc, message)

        def logged_recv(proc: Any, deadline: float) -> Any:
            reply = recv(proc, deadline)
            if timeline.on:
                op = reply.get("op") if isinstance(reply, dict) else type(reply).__name__
                timeline.events.append((time.monotonic(), _who(proc), "recv", str(op)))
            return reply

        worker_process.ChildProcess.send, worker_process.ChildProcess.recv = logged_send, logged_recv


def _who(proc: Any) -> str:
    return "R" if type(proc).__name__ == "ReferenceProcess" else "W"


def gaps(events: list[tuple[float, str, str, str]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for a, b in zip(events, events[1:]):
        out.setdefault(f"{a[1]}:{a[2]} {a[3]} -> {b[1]}:{b[2]} {b[3]}", []).append((b[0] - a[0]) * 1e3)
    return out


def print_table(events: list[tuple[float, str, str, str]], label: str) -> None:
    table = sorted(gaps(events).items(), key=lambda kv: -sum(kv[1]))
    total = sum(sum(v) for _, v in table) or 1.0
    print(f"\n{label}: {len(events)} events, {total / 1e3:.2f} s between events in all")
    print("| from -> to | n | median ms | total ms | share |")
    print("|---|---|---|---|---|")
    for key, v in table[:25]:
        print(f"| {key} | {len(v)} | {statistics.median(v):.3f} | {sum(v):.1f} | {sum(v) / total:.1%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--problems", nargs="*", default=["level1/1", "level1/8", "level2/5"])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    problems = {p.problem_id.removeprefix("builtin/"): p for p in load_builtin() if p.solution(args.backend)}
    timeline = Timeline()
    with tempfile.TemporaryDirectory(prefix="kx-trace-") as cache, \
            Evaluator(BenchConfig(backend=args.backend, cache_dir=Path(cache))) as ev:
        for name in args.problems:
            p = problems[name]
            for k in range(args.runs):
                timeline.on = k > 0
                start = len(timeline.events)
                source = p.solution(args.backend).replace('r"""\n', f'r"""\n// trace {k}\n', 1)
                [v] = ev.evaluate([EvalItem(p.problem_id, p.source, source)])
                if k:
                    took = (timeline.events[-1][0] - timeline.events[start][0]) if len(timeline.events) > start else 0.0
                    print(f"{name} run {k}: {v.status.value}, run {v.run_s:.3f} s, traced {took:.3f} s, phases "
                          f"{ {a: b for a, b in v.extra.get('phases', {}).items()} }", flush=True)
            print_table(timeline.events, f"after {name}")  # after each problem: a run cut short keeps its table


if __name__ == "__main__":
    main()
