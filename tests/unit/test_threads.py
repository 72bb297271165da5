"""apply_thread_limits: torch's threads and the children's OpenMP/MKL/OpenBLAS threads follow the job's
cpus_per_task, never more than the cores the process may use (checked in a fresh process each time)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kevin_exp.launch.threads import THREAD_ENV_VARS

PROBE = """
import json, os, sys
import torch
from kevin_exp.config import ResourcesConfig
from kevin_exp.launch.threads import THREAD_ENV_VARS, apply_thread_limits

cores = json.loads(sys.argv[2])
if cores:
    os.sched_setaffinity(0, cores)
first = apply_thread_limits(ResourcesConfig(cpus_per_task=int(sys.argv[1])))
torch.ones(64, 64) @ torch.ones(64, 64)
again = apply_thread_limits(ResourcesConfig(cpus_per_task=int(sys.argv[1])))
child = {name: os.environ.get(name) for name in THREAD_ENV_VARS}
print(json.dumps({"first": first, "again": again, "torch": torch.get_num_threads(),
                  "interop": torch.get_num_interop_threads(), "env": child}))
"""


def probe(cpus_per_task: int, cores: list[int] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS}
    out = subprocess.run([sys.executable, "-c", PROBE, str(cpus_per_task), json.dumps(cores or [])], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_cpu_per_task_gives_one_thread_everywhere():
    got = probe(1)
    assert got["first"] == got["again"] == got["torch"] == got["interop"] == 1
    assert got["env"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_the_count_never_exceeds_the_cores_the_process_may_use():
    one_core = sorted(os.sched_getaffinity(0))[:1]
    got = probe(64, one_core)
    assert got["first"] == got["again"] == got["torch"] == 1
    assert set(got["env"].values()) == {"1"}
    everything = probe(10_000)
    assert everything["torch"] == len(os.sched_getaffinity(0))


def test_the_share_is_cpus_per_task_capped_by_the_usable_cores(monkeypatch):
    from kevin_exp.config import ResourcesConfig
    from kevin_exp.launch import threads

    monkeypatch.setattr(threads, "usable_cores", lambda: 4)
    assert [threads.thread_count(ResourcesConfig(cpus_per_task=n)) for n in (0, 1, 3, 16)] == [1, 1, 3, 4]
