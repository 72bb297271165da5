"""Runners forked from the warm fork server (evaluator.worker_start=fork, the default) against runners that start
a fresh interpreter (exec): the same verdicts, the same descriptors, the same isolation; a server that dies costs
no verdict; closing the evaluator leaves no process behind."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kevin_exp.bench import BenchConfig, CheckRules, Status
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.conftest import fixture_text

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd_open (Linux 5.3)")

RELU = fixture_text("problem_relu.py")
# list_descriptors includes <dirent.h>, which the import rules refuse; the point here is what it would see
RULES = CheckRules(restrict_imports=False)


def item(name: str) -> EvalItem:
    return EvalItem(name, RELU, fixture_text("cpu", f"{name}.py"))


def config(build_cache, worker_start: str) -> BenchConfig:
    # correctness is compared, not speed: no recheck of a noisy speedup; a short hang limit
    return BenchConfig(backend="cpu", correctness_trials=2, warmup_trials=1, timed_trials=5, cache_dir=build_cache,
                       recheck_speedup=1e9, hang_floor_s=4.0, hang_ceiling_s=4.0, rules=RULES,
                       worker_start=worker_start)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_forked_runners_give_the_verdicts_execd_runners_give(build_cache):
    names = ["ok", "wrong", "segfault", "exit", "hang", "list_descriptors"]
    verdicts = {}
    for how in ("exec", "fork"):
        with Evaluator(config(build_cache, how)) as ev:
            verdicts[how] = dict(zip(names, ev.evaluate([item(n) for n in names])))
            assert ev.isolation().endswith(f"runners start by {'fork (from a warm fork server)' if how == 'fork' else 'exec'}")
    for name in names:
        e, f = verdicts["exec"][name], verdicts["fork"][name]
        assert (f.status, f.rule, f.correct) == (e.status, e.rule, e.correct), (name, e.reason, f.reason)
        assert f.isolation.endswith("runners start by fork (from a warm fork server)")
    assert verdicts["fork"]["ok"].status is Status.OK
    assert verdicts["fork"]["hang"].status is Status.TIMEOUT
    assert "SIGSEGV" in verdicts["fork"]["segfault"].reason and "SIGSEGV" in verdicts["exec"]["segfault"].reason

    def kinds(reason: str) -> list[str]:
        # "descriptors: 0=pipe:[123]; 3=/memfd:kx-exchange (deleted); ..." -> what each refers to, numbers aside
        found = re.findall(r"(\d+)=([^;]*);", reason)
        assert found, reason
        return sorted(re.sub(r"\[\d+\]", "", target) for _, target in found)

    forked = kinds(verdicts["fork"]["list_descriptors"].reason)
    assert forked == kinds(verdicts["exec"]["list_descriptors"].reason)
    assert not [k for k in forked if "socket" in k or "pidfd" in k or "anon_inode" in k], forked


def test_a_fork_server_killed_mid_session_costs_no_verdict(build_cache):
    with Evaluator(config(build_cache, "fork")) as ev:
        [first] = ev.evaluate([item("ok")])
        assert first.status is Status.OK, first.reason
        old = ev.fork_server.pid
        os.kill(old, signal.SIGKILL)
        later = ev.evaluate([item("ok"), item("wrong"), item("ok")])
        assert [v.status for v in later] == [Status.OK, Status.INCORRECT, Status.OK], [v.reason for v in later]
        # started again once, and forking again
        assert ev.fork_server.pid != old and ev.fork_server.describe().startswith("fork")
        assert ev.isolation().endswith("runners start by fork (from a warm fork server)")


def test_closing_the_evaluator_ends_the_server_and_every_runner(build_cache):
    ev = Evaluator(config(build_cache, "fork"))
    [v] = ev.evaluate([item("ok")])
    assert v.status is Status.OK, v.reason
    server = ev.fork_server.pid
    runners = [w.proc.pid for slot in ev._slots for w in slot._standby]
    assert runners and all(alive(p) for p in [server, *runners])
    ev.close()
    assert ev.fork_server.returncode == 0  # it saw the evaluator's end close and ended everything itself
    deadline = time.monotonic() + 30
    while any(alive(p) for p in [server, *runners]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in [server, *runners] if alive(p)]


def test_worker_start_is_refused_unless_fork_or_exec():
    with pytest.raises(ValueError, match="worker_start='spawn': expected one of fork, exec"):
        BenchConfig(worker_start="spawn")


def test_the_servers_imports_never_ask_the_cuda_driver_on_a_cuda_build(tmp_path):
    """On a CUDA build ``import torch.utils.cpp_extension`` asks ``torch.cuda.is_available()``, which starts the
    driver and its threads (a fork then cannot use CUDA). Here torch is a CPU build, so the child makes it look
    like a CUDA build and records every such question: the server's imports ask none, and leave the function as
    they found it (tests/gpu checks the fork on a real GPU)."""
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import json, sys, torch
        asked = []
        def is_available():
            asked.append(1)
            return True
        torch.cuda.is_available = is_available
        torch.cuda._is_compiled = lambda: True
        torch.version.cuda = "13.0"
        from kevin_exp.bench.worker.fork_server import warm_imports
        warm_imports(sys.argv[1])
        import torch.utils.cpp_extension as ce
        print(json.dumps({"asked": len(asked), "restored": torch.cuda.is_available is is_available,
                          "cuda_home": ce.CUDA_HOME}))
    """))
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    (tmp_path / "nvcc").write_text("#!/bin/sh\n")  # a toolkit on PATH: the case in which the module asks
    (tmp_path / "nvcc").chmod(0o755)
    out = subprocess.run([sys.executable, str(script), "cuda"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["cuda_home"] and seen == {"asked": 0, "restored": True, "cuda_home": seen["cuda_home"]}
    # without the server's guard the same import asks: the probe above would see it
    plain = script.read_text().replace("from kevin_exp.bench.worker.fork_server import warm_imports\n", "") \
        .replace("warm_imports(sys.argv[1])\n", "")
    script.write_text(plain)
    out = subprocess.run([sys.executable, str(script), "cuda"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1])["asked"] >= 1
