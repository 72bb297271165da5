"""Who started this process's ranks: a world of one that a learner joined on its own is not a launcher's, so a
later job of the same process (a sweep's next point) still starts ranks of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, torch
from kevin_exp.launch.world import context_from_env, join_process_group
from kevin_exp.launch.ranks import launched_ranks
before = launched_ranks()
join_process_group(context_from_env(), torch.device("cpu"), 60)
print(json.dumps({"before": before, "after": launched_ranks(), "world": torch.distributed.get_world_size()}))
"""


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_world_of_one_joined_in_process_is_not_taken_for_a_launchers():
    assert _probe() == {"before": False, "after": False, "world": 1}


def test_ranks_a_launcher_set_are_its():
    got = _probe(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    assert got == {"before": True, "after": True, "world": 1}


CHILDREN = """
import json, os, subprocess, sys, torch
from kevin_exp.launch.world import context_from_env, join_process_group
join_process_group(context_from_env(), torch.device("cpu"), 60)
child = "from kevin_exp.launch.ranks import launched_ranks; import os, json; print(json.dumps([launched_ranks(), 'RANK' in os.environ]))"
inherited = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout
relaunched = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                            env={**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29544"}).stdout
print(json.dumps({"inherited": json.loads(inherited), "relaunched": json.loads(relaunched)}))
"""


def test_a_child_of_such_a_process_starts_clean_unless_a_launcher_set_its_own_world():
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", CHILDREN], cwd=REPO, env=clean, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"inherited": [False, False], "relaunched": [True, True]}
