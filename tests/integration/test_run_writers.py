"""One writer per run folder: the ranks a run starts itself die with it however it dies, and a second process
that would write into a folder whose writer still lives is refused (a restart beside orphaned ranks once wrote
the same step twice)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kevin_exp.errors import UserError
from kevin_exp.run.folder import RunFolder
from tests.integration.test_multirank_launch import REPO, SMOKE


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_ranks_started_by_the_entry_point_end_when_it_is_killed_outright(tmp_path):
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "kevin_exp.train", *SMOKE, "steps=50", "resources.ranks_per_node=2",
                                 f"hydra.run.dir={run_dir}"], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 300
        starts = []
        while not starts and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            meta = run_dir / "meta.json"
            starts = json.loads(meta.read_text()).get("starts", []) if meta.is_file() else []
        assert starts, "the ranks never joined"
        pids = [r["pid"] for r in starts[0]["ranks"]]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        # the ranks run in process groups of their own: this reaches the launcher alone, with no chance to clean up
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "ranks outlived the process that started them"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        for pid in filter(_alive, pids):  # what a failure left behind
            os.kill(pid, signal.SIGKILL)


def test_a_second_writer_of_a_run_folder_is_refused_while_the_first_lives(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom kevin_exp.run.folder import RunFolder\n"
         "RunFolder.at(sys.argv[1])\nprint('held', flush=True)\ntime.sleep(120)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        who = rf"pid {holder.pid} on {re.escape(socket.gethostname())}"
        with pytest.raises(UserError, match=rf"run_dir={tmp_path}: another process \({who}\) is writing this run"):
            RunFolder.at(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    folder = RunFolder.at(tmp_path)  # the lock ended with its holder
    again = RunFolder.at(tmp_path)  # and this process may open its own folder again
    again.close()
    folder.close()
