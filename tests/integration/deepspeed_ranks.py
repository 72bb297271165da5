"""Starting N ranks of a script as real processes on this machine (CPU, gloo), as torch's launcher does."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")]))
    return env


def start_ranks(script: str, args: list[str], world: int, log_dir: Path) -> list[subprocess.Popen]:
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([sys.executable, str(REPO / "tests" / "integration" / script), *args], cwd=REPO,
                             env=rank_env(r, world, port), stdout=open(log_dir / f"rank{r}.log", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True)
            for r in range(world)]


def run_ranks(script: str, args: list[str], world: int, log_dir: Path, timeout: float = 300) -> None:
    """Runs the ranks to the end; fails with their logs' tails if any rank fails (a hang fails at the
    process group's timeout, which the scripts keep short)."""
    procs = start_ranks(script, args, world, log_dir)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append("timeout")
    if any(c != 0 for c in codes):
        tails = "\n".join(f"--- rank {r} ({c}):\n" + (log_dir / f"rank{r}.log").read_text()[-3000:]
                          for r, c in enumerate(codes))
        raise AssertionError(f"{script} failed: {codes}\n{tails}")
