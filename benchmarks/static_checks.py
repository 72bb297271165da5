"""What the static checks' deadline costs: every built-in solution checked in this process (no deadline,
``static_check_deadline_s=0``) and through the checker process (the default), the median per candidate of
each, and the first check's cost (starting a checker); then the worst inputs the bounds allow, timed in this
process (they must stay well inside the deadline).

    python benchmarks/static_checks.py [--repeat N]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from kevin_exp.bench.checks import check_candidate, deadline
from kevin_exp.bench.checks.native import check_native
from kevin_exp.bench.config import CheckRules
from kevin_exp.bench.spec import ExtensionSpec

ROOT = Path(__file__).resolve().parents[1]


def _ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    guarded = CheckRules()
    inline = dataclasses.replace(guarded, static_check_deadline_s=0)
    solutions = sorted(ROOT.glob("src/kevin_exp/tasks/builtin/solutions/*/*/*.py"))
    first = solutions[0].read_text()
    start = time.perf_counter()
    check_candidate(first, "cpu", guarded)
    print(f"first check (starts a checker process): {(time.perf_counter() - start) * 1e3:.1f} ms")
    rows = []
    for path in solutions:
        src = path.read_text()
        backend = "cuda" if "cuda" in path.parts else "cpu"
        a = _ms(lambda: check_candidate(src, backend, inline), args.repeat)
        b = _ms(lambda: check_candidate(src, backend, guarded), args.repeat)
        rows.append((a, b))
    a = statistics.median(r[0] for r in rows)
    b = statistics.median(r[1] for r in rows)
    print(f"{len(rows)} built-in solutions, median per candidate: in process {a:.1f} ms, "
          f"through the checker {b:.1f} ms (overhead {b - a:.1f} ms); checkers kept: {len(deadline._idle)}")
    worst = {
        "native, 'f(' up to max_extension_bytes": ExtensionSpec(
            name="e", cpp_sources=("f(" * (guarded.max_extension_bytes // 2 - 64),), functions=("f",)),
        "native, 'a ' up to max_extension_bytes": ExtensionSpec(
            name="e", cpp_sources=("a " * (guarded.max_extension_bytes // 2 - 64),), functions=("f",)),
    }
    for name, spec in worst.items():
        print(f"{name}: {_ms(lambda: check_native(spec, 'cpu', inline), 3):.0f} ms")
    line = "y = (x.view(-1), x.size(0) * 2, [a for a in range(3)])\n"
    big = first + line * ((guarded.max_check_source_bytes - len(first.encode())) // len(line))
    start = time.perf_counter()
    _, violations = check_candidate(big, "cpu", inline)
    print(f"python, {len(big.encode())} bytes of module statements: {(time.perf_counter() - start) * 1e3:.0f} ms "
          f"({[v.rule for v in violations][:3]})")


if __name__ == "__main__":
    main()
