"""Evaluates candidates in a child process with a deadline: for attacks on the evaluator's own process (a
static check that goes quadratic, a parser that recurses), where a stall or crash must not take the test
session with it. ``python -m tests.adversarial.isolated SPEC.json`` prints the verdicts as JSON."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kevin_exp.bench import BenchConfig
from kevin_exp.bench.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]


def evaluate_with_deadline(items: list[tuple[str, str, str]], cfg: BenchConfig, deadline_s: float) -> list[Verdict] | None:
    """Verdicts on (problem_id, reference, candidate) items, or None when the evaluator did not answer in time."""
    with tempfile.TemporaryDirectory(prefix="kx-adv-") as tmp:
        spec = Path(tmp) / "spec.json"
        settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                    if isinstance(getattr(cfg, f.name), (bool, int, float, str))}
        spec.write_text(json.dumps({"items": items, "cache_dir": str(cfg.cache_dir), "settings": settings}))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen([sys.executable, "-m", "tests.adversarial.isolated", str(spec)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            return None
        if proc.returncode != 0:
            return None
        return [Verdict.from_json(v) for v in json.loads(out.decode().strip().splitlines()[-1])]


def main(path: str) -> None:
    from kevin_exp.bench.evaluator import EvalItem, Evaluator

    spec = json.loads(Path(path).read_text())
    cfg = BenchConfig(cache_dir=Path(spec["cache_dir"]), **spec["settings"])
    with Evaluator(cfg) as ev:
        verdicts = ev.evaluate([EvalItem(*item) for item in spec["items"]])
    print(json.dumps([v.to_json() for v in verdicts]))


if __name__ == "__main__":
    main(sys.argv[1])
