"""A run whose verdicts are mostly ``infra_error`` ends with one line saying so: the machine's toolchain failed,
not the model (issue 32: every build failed on a checkout path with a space, and the run ended at reward 0 with no
hint)."""
from __future__ import annotations

import json
from pathlib import Path

from kevin_exp.records.summary import headline_lines, infra_line
from tests.helpers import compose_train

LINK_FAILED = ("the evaluator could not build this candidate (link failed for reasons of the build machine: "
               "/usr/bin/ld: cannot find /home/me/my: No such file or directory)")


def rows(n_infra: int, n_other: int) -> list[dict]:
    infra = {"score": 0.0, "correct": False, "status": "infra_error", "reason": LINK_FAILED, "backend": "cpu"}
    other = {"score": 0.0, "correct": False, "status": "compile_error", "reason": "g++ main.cpp failed: x",
             "backend": "cpu"}
    return [infra] * n_infra + [other] * n_other


def test_a_run_of_mostly_infra_errors_names_the_toolchain_and_the_reason() -> None:
    line = infra_line(rows(7, 3))
    assert line is not None and "\n" not in line
    assert line.startswith("note: 7 of 10 kernels (70%) ended as infra_error"), line
    assert "not the model's" in line and "toolchain or build environment" in line, line
    assert "ld: cannot find /home/me/my" in line and "python -m kevin_exp.bench --builtin --backend cpu" in line


def test_a_run_with_few_infra_errors_gets_no_such_line() -> None:
    assert infra_line(rows(5, 5)) is None and infra_line(rows(0, 4)) is None


def test_the_closing_summary_blames_the_machine_not_the_smoke_model(tmp_path: Path) -> None:
    cfg = compose_train(["model=tiny"])
    (tmp_path / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(4, 0)))
    lines = headline_lines(tmp_path, cfg)
    assert lines[-1] == infra_line(rows(4, 0)), lines
    assert not any("its reward stays at 0" in line for line in lines), lines
