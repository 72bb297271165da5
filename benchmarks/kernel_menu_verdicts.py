"""What the evaluator makes of each kernel of the kernel menu, with experiment=learn_cpu's evaluator settings.

    python benchmarks/kernel_menu_verdicts.py [--cache DIR] [--size N] [--repeats 2]

Each kind of each reference's menu (fast, slow, off by one, broken) is evaluated ``--repeats`` times in one
``Evaluator`` on a compile cache of its own (a fresh temporary one by default, so the references are timed
here); ``--size`` replaces the references' 1024 x 1024 input. Prints one line per verdict: the status, the
speedup, the kernel's and the reference's time, the run's seconds and the reference timing's CPU contention.
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.config.compose import compose_overrides
from kevin_exp.tasks.kernel_menu import KINDS, load_menu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=None, help="compile cache (default: a fresh temporary folder)")
    parser.add_argument("--size", type=int, default=1024, help="rows and columns of the references' input")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="kx-menu-verdicts-")
    cfg = compose_overrides(["experiment=learn_cpu"])
    bench = dataclasses.replace(cfg.evaluator.to_bench(), cache_dir=cache)
    print(f"cache {cache}, size {args.size} x {args.size}")
    with Evaluator(bench) as ev:
        for task in load_menu([1]):
            source = task.source.replace("rows = 1024", f"rows = {args.size}").replace("cols = 1024", f"cols = {args.size}")
            for repeat in range(args.repeats):
                for kind in KINDS:
                    t0 = time.perf_counter()
                    [v] = ev.evaluate([EvalItem(task.problem_id, source, task.program(kind, "cpu"))])
                    ref = v.extra.get("reference", {})
                    print(f"{task.name} {kind:10s} #{repeat}: {v.status.value:13s} speedup {v.speedup or 0:8.3f} "
                          f"kernel {v.runtime_ms or 0:8.3f} ms ref {v.ref_runtime_ms or 0:7.3f} ms "
                          f"(contention {ref.get('contention')}, {ref.get('how')}) run {v.run_s:.2f} s "
                          f"wall {time.perf_counter() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
