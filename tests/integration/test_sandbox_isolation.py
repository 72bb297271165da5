"""A candidate run through the real Evaluator (cpu backend, namespace sandbox) reads nothing of the host
beyond the Python installation, the package and the build cache, persists nothing into the next evaluation,
and does not see the evaluator's environment. Static rules are switched off: the sandbox must hold on its own.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import uuid
from pathlib import Path

import pytest

import kevin_exp
from kevin_exp.bench import BenchConfig, CheckRules, Status
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.bench.jail import python_roots
from tests.conftest import fixture_text

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="namespace sandboxes need Linux, root and unshare",
)
SECRET = f"s3cr3t-{uuid.uuid4().hex}"
CHECKOUT = Path(kevin_exp.__file__).resolve().parents[2]
PERSIST_DIRS = ("/var/tmp", "/run/lock", "/dev/shm", "/tmp")
UNREADABLE = ("/etc/shadow", "/etc/passwd", "/home", "/srv", "/var", "/run", str(CHECKOUT / ".git"),
              str(CHECKOUT / "pyproject.toml"), str(CHECKOUT / "tests"))

PROBE = r'''
import json, os

KX_MARK = "@MARK@"
KX_CHECK = "@CHECK@"


def kx_probe():
    obs = {"readable": [], "listing_root": None, "wrote": [], "found": [], "secret": None, "env": sorted(os.environ)}
    for path in @UNREADABLE@:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                open(path, "rb").read(16)
            obs["readable"].append(path)
        except OSError:
            pass
    try:
        obs["listing_root"] = sorted(os.listdir("/root"))
    except OSError:
        pass
    for d in @PERSIST@:
        try:
            with open(os.path.join(d, "kx-persist-" + KX_MARK), "w") as f:
                f.write("x")
            obs["wrote"].append(d)
        except OSError:
            pass
        if KX_CHECK and os.path.exists(os.path.join(d, "kx-persist-" + KX_CHECK)):
            obs["found"].append(d)
    obs["secret"] = os.environ.get("KX_TEST_SECRET")
    obs["package"] = os.path.exists(os.path.join(os.path.dirname(__import__("kevin_exp").__file__), "bench", "jail.py"))
    return obs
'''


def probe_candidate(mark: str, check: str) -> str:
    base = fixture_text("cpu", "ok.py")
    probe = (PROBE.replace("@MARK@", mark).replace("@CHECK@", check).replace("@UNREADABLE@", repr(UNREADABLE))
             .replace("@PERSIST@", repr(PERSIST_DIRS)))
    forward = "    def forward(self, x):\n        return ext.leaky(x)"
    assert forward in base
    raising = "    def forward(self, x):\n        raise RuntimeError('KXPROBE' + json.dumps(kx_probe()) + 'KXEND')"
    return probe + base.replace(forward, raising)


@pytest.fixture(scope="module")
def evaluator(build_cache):
    rules = dataclasses.replace(CheckRules(), **{f.name: False for f in dataclasses.fields(CheckRules)})
    config = BenchConfig(backend="cpu", timed_trials=3, warmup_trials=1, hang_floor_s=90, load_timeout_s=90, cache_dir=build_cache,
                         rules=rules, feedback_chars=20000, sandbox="namespace")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KX_TEST_SECRET", SECRET)
        with Evaluator(config) as ev:
            yield ev


def observe(evaluator, mark: str, check: str = "") -> tuple[dict, str]:
    [v] = evaluator.evaluate([EvalItem(f"probe-{mark}", fixture_text("problem_relu.py"), probe_candidate(mark, check))])
    text = json.dumps(dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v.__dict__, default=str)
    m = re.search(r"KXPROBE(.*?)KXEND", v.feedback + "\n" + v.reason)
    assert v.status is Status.RUNTIME_ERROR and m, (v.status, v.reason, v.feedback)
    return json.loads(m.group(1).replace('\\"', '"')), text


def test_the_worker_sees_a_minimal_root_and_a_clean_environment(evaluator) -> None:
    assert "minimal read-only root" in evaluator.policy.describe(), evaluator.policy.describe()
    obs, verdict_text = observe(evaluator, uuid.uuid4().hex)
    assert obs["readable"] == [], obs
    under_root = {Path(r).relative_to("/root").parts[0] for r in python_roots() if r.startswith("/root/")}
    assert obs["listing_root"] is None or set(obs["listing_root"]) <= under_root, obs
    assert obs["package"] is True
    assert obs["secret"] is None and SECRET not in verdict_text
    assert "KX_TEST_SECRET" not in obs["env"] and "PYTHONSTARTUP" not in obs["env"]


def test_nothing_written_survives_into_the_next_evaluation(evaluator) -> None:
    first = uuid.uuid4().hex
    obs1, _ = observe(evaluator, first)
    assert "/var/tmp" not in obs1["wrote"] and "/run/lock" not in obs1["wrote"]
    obs2, _ = observe(evaluator, uuid.uuid4().hex, check=first)
    assert obs2["found"] == [], obs2
    for d in PERSIST_DIRS:
        assert not Path(d, f"kx-persist-{first}").exists()


@pytest.mark.parametrize("target", ["/etc/passwd", str(CHECKOUT / "pyproject.toml")])
def test_an_absolute_include_fails_to_compile_and_quotes_nothing(evaluator, target: str) -> None:
    source = fixture_text("cpu", "ok.py").replace('source = r"""\n', f'source = r"""\n#include "{target}"\n', 1)
    assert f'#include "{target}"' in source
    [v] = evaluator.evaluate([EvalItem("include", fixture_text("problem_relu.py"), source + f"# {uuid.uuid4().hex}\n")])
    assert v.status is Status.COMPILE_ERROR, v.reason
    text = v.reason + "\n" + v.feedback
    content = [ln.strip() for ln in Path(target).read_text().splitlines() if len(ln.strip()) > 12]
    assert content and not [ln for ln in content if ln in text], text
