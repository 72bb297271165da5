"""A build that fails for the machine's reasons (out of time under load, a compiler that is not there) is retried
once and then an ``infra_error``: never the candidate's compile error, never kept, never fed back as its mistake.
A compile error is kept, and feeds back only the compiler's diagnostics about the candidate's sources."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from kevin_exp.bench import Status
from kevin_exp.bench.build import failures
from kevin_exp.bench.build.builder import Builder, BuildError
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.bench.spec import ExtensionSpec
from tests.adversarial.attacks import HONEST_KERNEL, PROBLEM, candidate, config

ROOT = Path(__file__).resolve().parents[2]

_MISSING_COMPILER = r"""
import json, sys
from pathlib import Path
from kevin_exp.bench.build.builder import Builder, BuildError
from kevin_exp.bench.spec import ExtensionSpec

builder = Builder(Path(sys.argv[1]), backend="cpu", timeout_s=60)
spec = ExtensionSpec(name="e", cpp_sources=("torch::Tensor f(torch::Tensor x) { return x; }",), functions=("f",))
try:
    builder.build(spec)
    print(json.dumps({"built": True}))
except BuildError as exc:
    print(json.dumps({"built": False, "kind": exc.kind, "attempts": exc.attempts, "summary": str(exc),
                      "remembered": builder._failure(builder.cache_key(spec)).exists()}))
"""


def test_a_missing_compiler_is_the_machine_s_failure(tmp_path: Path) -> None:
    """A toolchain failure (the compiler is not there): retried once, then infra, and not remembered."""
    env = {**os.environ, "CXX": "/nonexistent/kx-c++", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", _MISSING_COMPILER, str(tmp_path / "cache")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["built"] is False and answer["kind"] == failures.INFRA, answer
    assert answer["attempts"] == 2 and not answer["remembered"], answer


def test_a_build_out_of_time_is_retried_and_never_kept(build_cache: Path) -> None:
    spec = ExtensionSpec(name="e", cpp_sources=(HONEST_KERNEL + f"// {uuid.uuid4().hex}\n",), functions=("leaky",))
    builder = Builder(build_cache, backend="cpu", timeout_s=120)
    builder.fast.lean.dirs()  # the shared lean headers exist before the limit is cut
    builder.timeout_s = 0.05
    try:
        builder.build(spec)
        raise AssertionError("a build of 50 ms cannot succeed")
    except BuildError as exc:
        error = exc
    assert error.kind == failures.INFRA and error.timed_out and error.attempts == 2, (error.kind, error.attempts)
    assert len(error.limits_s) == 2 and error.limits_s[1] >= error.limits_s[0]
    key = builder.cache_key(spec)
    assert not builder._failure(key).exists()
    builder.timeout_s = 300.0
    assert builder.build(spec).so_path.exists()  # the next try builds it: nothing of the timeout was kept


def test_evaluator_infra_error_is_not_fed_back_or_replayed_and_compile_errors_quote_only_diagnostics(build_cache):
    tag = uuid.uuid4().hex
    honest = candidate(HONEST_KERNEL + f"// {tag}\n")
    broken = candidate(HONEST_KERNEL.replace("return out;", "return out") + f"// {tag}\n")
    with Evaluator(config(build_cache)) as ev:
        ev.builder.fast.lean.dirs()
        ev.builder.timeout_s = 0.05
        [slow] = ev.evaluate([EvalItem("slow", PROBLEM, honest)])
        assert slow.status is Status.INFRA_ERROR, (slow.status, slow.reason)
        assert slow.extra["build_attempts"] == 2 and slow.extra["build_failure"] == failures.INFRA
        assert not slow.correct and "$ " not in slow.feedback and "-isystem" not in slow.feedback
        ev.builder.timeout_s = 300.0
        # the next step's identical candidate is built again (in memory and on disk nothing of the failure was kept)
        ok, bad = ev.evaluate([EvalItem("again", PROBLEM, honest), EvalItem("broken", PROBLEM, broken)])
        assert ok.status is Status.OK, (ok.status, ok.reason)
        assert bad.status is Status.COMPILE_ERROR, (bad.status, bad.reason)
        assert "main.cpp" in bad.feedback and "error" in bad.feedback
        assert "$ " not in bad.feedback and "-isystem" not in bad.feedback and "-D" not in bad.feedback
        # a compile error is the sources': it is kept, and replayed without compiling
        [again] = ev.evaluate([EvalItem("broken again", PROBLEM, broken)])
        assert again.status is Status.COMPILE_ERROR and again.feedback == bad.feedback
