"""Wall time of a local sweep whose jobs share the machine: one ``experiment=cpu_smoke resources=cpu`` job
alone, then the same job at three gammas started together (as a local multirun or a local SLURM node runs
them), each in its own temporary run dir.

    python benchmarks/concurrent_jobs.py [--src DIR] [--jobs 3] [--entry kevin_exp.train | --entry FILE.py]

``--src`` picks the checkout whose ``src`` goes first on PYTHONPATH (default: this one), so the same script
times another checkout's code. ``--entry`` is the module run with ``-m``, or a Python file run as a script.
The jobs start without OMP_NUM_THREADS, MKL_NUM_THREADS or OPENBLAS_NUM_THREADS in their environment, as
from a plain shell.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GAMMAS = ("0.0", "0.4", "1.0", "0.2", "0.6", "0.8")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def job_command(entry: str, run_dir: Path, gamma: str) -> list[str]:
    launch = [str(Path(entry).resolve())] if entry.endswith(".py") else ["-m", entry]
    # rollout.backend=hf: the tiny model samples (cpu_smoke's own scripted answers would add compiles, and older
    # checkouts, which this script also times, have no scripted backend)
    return [sys.executable, *launch, "experiment=cpu_smoke", "rollout.backend=hf", "resources=cpu", f"gamma={gamma}",
            "logger.progress=none", f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"]


def run_job(command: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({' '.join(command[1:])}):\n{proc.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the src folder put first on PYTHONPATH")
    parser.add_argument("--jobs", type=int, default=3, choices=range(1, len(GAMMAS) + 1))
    parser.add_argument("--entry", default="kevin_exp.train", help="module run with -m, or a .py file")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    inherited = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = str(args.src.resolve()) + (os.pathsep + inherited if inherited else "")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    print(f"src {args.src.resolve()}  entry {args.entry}  cores {cores}")

    with tempfile.TemporaryDirectory(prefix="kx_concurrent_") as tmp:
        root = Path(tmp)
        alone = run_job(job_command(args.entry, root / "alone", GAMMAS[0]), env, root)
        print(f"one job alone          {alone:7.1f} s")
        commands = [job_command(args.entry, root / f"job{i}", GAMMAS[i]) for i in range(args.jobs)]
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            times = list(pool.map(lambda c: run_job(c, env, root), commands))
        total = time.perf_counter() - start
        for i, took in enumerate(times):
            print(f"job {i} (gamma={GAMMAS[i]})      {took:7.1f} s")
        print(f"{args.jobs} jobs together        {total:7.1f} s")


if __name__ == "__main__":
    main()
