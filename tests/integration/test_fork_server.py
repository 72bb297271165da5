"""Runners forked from the warm fork server (evaluator.worker_start=fork, the default) against runners that start
a fresh interpreter (exec): the same verdicts, the same descriptors, the same isolation; a server that dies costs
no verdict; closing the evaluator leaves no process behind."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

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
        # on a CUDA build, importing torch.utils.cpp_extension asks whether CUDA is available: through NVML, so the
        # driver (and its thread) does not start in the server (tests/gpu checks the fork itself)
        environ = Path(f"/proc/{ev.fork_server.pid}/environ").read_bytes().split(b"\0")
        assert b"PYTORCH_NVML_BASED_CUDA_CHECK=1" in environ


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
    with pytest.raises(ValueError, match="worker_start='spawn': expected 'fork' or 'exec'"):
        BenchConfig(worker_start="spawn")
