"""Command line: ``python -m kevin_exp.bench``.

    python -m kevin_exp.bench --reference REF.py --candidate CAND.py [--backend cpu|cuda] [--json]
    python -m kevin_exp.bench --problems DIR --candidates DIR [--backend ...]    # JSON lines
    python -m kevin_exp.bench --builtin [--backend ...]    # the built-in suite against its own solutions

Exit status is 0 whatever the verdicts; non-zero only for this program's own errors (a missing file,
a bad argument), with a one-line message naming the problem.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from kevin_exp.bench.config import BenchConfig, CheckRules
from kevin_exp.errors import UserError, exits_on_user_error

RULE_SWITCHES = [f.name for f in dataclasses.fields(CheckRules) if f.type in (bool, "bool")]


class UsageError(UserError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kevin_exp.bench", description="Evaluate KernelBench-format candidates.")
    src = p.add_argument_group("what to evaluate (one of)")
    src.add_argument("--reference", type=Path, help="problem file (defines Model, get_inputs, get_init_inputs)")
    src.add_argument("--candidate", type=Path, help="candidate file (defines ModelNew)")
    src.add_argument("--problems", type=Path, help="folder of problem files")
    src.add_argument("--candidates", type=Path, help="folder of candidate files, matched to problems by file name")
    src.add_argument("--builtin", action="store_true", help="the built-in suite against its reference solutions")
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None, help="default: cuda when a GPU is visible, else cpu")
    p.add_argument("--json", action="store_true", help="print JSON (one object per line) instead of text")
    p.add_argument("--correctness-trials", type=int, default=BenchConfig.correctness_trials)
    p.add_argument("--timed-trials", type=int, default=BenchConfig.timed_trials)
    p.add_argument("--warmup-trials", type=int, default=BenchConfig.warmup_trials)
    p.add_argument("--compile-timeout", type=float, default=BenchConfig.compile_timeout_s)
    p.add_argument("--hang-floor", type=float, default=BenchConfig.hang_floor_s, help="seconds: the least a run may take")
    p.add_argument("--hang-ceiling", type=float, default=BenchConfig.hang_ceiling_s, help="seconds: the most a run may take")
    p.add_argument("--recheck-speedup", type=float, default=BenchConfig.recheck_speedup,
                   help="speedups above this are re-timed in a fresh process before they count")
    p.add_argument("--memory-limit-gb", type=float, default=BenchConfig.memory_limit_gb)
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--build-mode", choices=("fast", "torch"), default="fast")
    p.add_argument("--sandbox", choices=("auto", "namespace", "process"), default="auto")
    p.add_argument("--allow", action="append", default=[], metavar="RULE", help=f"turn a hack rule off; one of {', '.join(RULE_SWITCHES)}")
    return p


def _config(args: argparse.Namespace) -> BenchConfig:
    unknown = [r for r in args.allow if r not in RULE_SWITCHES]
    if unknown:
        raise UsageError(f"--allow {unknown[0]}: unknown rule; choose from {', '.join(RULE_SWITCHES)}")
    rules = dataclasses.replace(CheckRules(), **{r: False for r in args.allow})
    backend = args.backend or _default_backend()
    try:
        return _bench_config(args, backend, rules)
    except ValueError as e:  # BenchConfig checks its own values
        raise UsageError(str(e)) from None


def _bench_config(args: argparse.Namespace, backend: str, rules: CheckRules) -> BenchConfig:
    return BenchConfig(
        backend=backend,
        correctness_trials=args.correctness_trials,
        timed_trials=args.timed_trials,
        warmup_trials=args.warmup_trials,
        compile_timeout_s=args.compile_timeout,
        hang_floor_s=args.hang_floor,
        hang_ceiling_s=args.hang_ceiling,
        recheck_speedup=args.recheck_speedup,
        memory_limit_gb=args.memory_limit_gb,
        cache_dir=args.cache_dir,
        build_mode=args.build_mode,
        sandbox=args.sandbox,
        rules=rules,
    )


def _default_backend() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _read(path: Path, what: str) -> str:
    if not path.is_file():
        raise UsageError(f"{what} {path}: no such file")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path}: cannot read it ({exc})") from exc


def _items(args: argparse.Namespace, backend: str) -> list:
    from kevin_exp.bench.evaluator import EvalItem

    modes = [bool(args.reference or args.candidate), bool(args.problems or args.candidates), args.builtin]
    if sum(modes) != 1:
        raise UsageError("give exactly one of: --reference and --candidate, --problems and --candidates, or --builtin")
    if args.reference or args.candidate:
        if not (args.reference and args.candidate):
            raise UsageError("--reference and --candidate go together")
        return [EvalItem(args.reference.stem, _read(args.reference, "--reference"), _read(args.candidate, "--candidate"))]
    if args.problems or args.candidates:
        if not (args.problems and args.candidates):
            raise UsageError("--problems and --candidates go together")
        for flag, folder in (("--problems", args.problems), ("--candidates", args.candidates)):
            if not folder.is_dir():
                raise UsageError(f"{flag} {folder}: no such folder")
        problems = {p.name: p for p in sorted(args.problems.glob("*.py"))}
        items = []
        for cand in sorted(args.candidates.glob("*.py")):
            if cand.name not in problems:
                raise UsageError(f"--candidates {cand}: no problem file named {cand.name} in {args.problems}")
            items.append(EvalItem(cand.stem, _read(problems[cand.name], "problem"), _read(cand, "candidate")))
        if not items:
            raise UsageError(f"--candidates {args.candidates}: no .py files")
        return items
    from kevin_exp.tasks import load_builtin

    items = []
    for problem in load_builtin():
        solution = problem.solution(backend)
        if solution is not None:
            items.append(EvalItem(problem.problem_id, problem.source, solution))
    return items


def _print_text(verdict) -> None:
    line = f"{verdict.problem_id}: {verdict.status.value}"
    if verdict.correct:
        line += f"  speedup {verdict.speedup:.3f}x  ({verdict.ref_runtime_ms:.4g} ms -> {verdict.runtime_ms:.4g} ms)"
    else:
        line += f"  {verdict.reason}"
    line += f"  [compile {verdict.compile_s:.1f}s{' cached' if verdict.cache_hit else ''}, run {verdict.run_s:.1f}s]"
    print(line, flush=True)


@exits_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = _config(args)
    items = _items(args, config.backend)
    from kevin_exp.bench.evaluator import Evaluator

    with Evaluator(config) as evaluator:
        verdicts = evaluator.evaluate(items)
    for verdict in verdicts:
        if args.json:
            print(json.dumps(verdict.to_json()), flush=True)
        else:
            _print_text(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
