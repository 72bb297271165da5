"""Compiles run in the sandbox: an unprivileged leased uid, a minimal read-only root (toolchain, CUDA,
Python installation, lean headers, shared build-cache parts, their own folder), the allow-listed environment;
and no compiler message quotes a file outside the candidate's sources and the toolkit's headers."""
from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

import kevin_exp
from kevin_exp.bench.build import proc
from kevin_exp.bench.build.builder import Builder, BuildError
from kevin_exp.bench.spec import ExtensionSpec

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="sandboxed compiles need Linux and root",
)
CHECKOUT = Path(kevin_exp.__file__).resolve().parents[2]


def test_compiles_are_sandboxed_on_a_root_linux_machine() -> None:
    assert proc.sandboxed(), proc.sandbox_note()


def test_the_compiler_runs_as_another_uid_and_sees_only_the_toolchain(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KX_TEST_SECRET", "s3cr3t-compile-side")
    script = ("id -u; for p in /etc/passwd /etc/shadow /home /var /run /srv " f"{CHECKOUT}/.git {CHECKOUT}/tests "
              f"{CHECKOUT}/pyproject.toml {CHECKOUT}/src/kevin_exp/bench/evaluator.py /root/.bashrc; do test -e $p && echo SEEN $p; done; "
              "ls -A /root; echo env:$KX_TEST_SECRET; echo x > out.txt; echo x > /usr/kx-test 2>/dev/null || echo RO")
    res = proc.run(["sh", "-c", script], tmp_path, time.monotonic() + 60, 4.0)
    assert res.ok, res.output
    lines = res.output.splitlines()
    assert int(lines[0]) != os.getuid() and int(lines[0]) >= 61000
    assert not [ln for ln in lines if ln.startswith("SEEN")], res.output
    assert "env:" in lines and "s3cr3t" not in res.output
    assert "RO" in lines and not Path("/usr/kx-test").exists()
    out = tmp_path / "out.txt"
    assert out.read_text() == "x\n" and out.stat().st_uid == os.getuid()  # handed back to us afterwards
    assert (tmp_path.stat().st_mode & 0o777) != 0o777  # the folder's mode is restored


@pytest.fixture(scope="module")
def builder(build_cache: Path) -> Builder:
    return Builder(build_cache)


def include_spec(path: str) -> ExtensionSpec:
    source = f'#include "{path}"\ntorch::Tensor f(torch::Tensor x) {{ return x; }}\n// {uuid.uuid4().hex}\n'
    return ExtensionSpec(name="inc", cpp_sources=(source,), functions=("f",))


@pytest.mark.parametrize("target", ["/etc/passwd", str(CHECKOUT / "pyproject.toml"),
                                    str(Path(kevin_exp.__file__).resolve().parent / "bench" / "evaluator.py")])
def test_an_absolute_include_finds_nothing_and_quotes_nothing(builder: Builder, target: str) -> None:
    with pytest.raises(BuildError) as info:
        builder.build(include_spec(target))
    text = str(info.value) + "\n" + info.value.log
    assert "No such file or directory" in text
    content = [ln.strip() for ln in Path(target).read_text().splitlines() if len(ln.strip()) > 12]
    assert content and not [ln for ln in content if ln in text]
