"""The reward environment: compile, check and time KernelBench-format candidates in sandboxed workers.

This package knows nothing of RL, Hydra or models. Entry points: ``evaluate`` (batch API),
``python -m kevin_exp.bench`` (CLI).
"""
from kevin_exp.bench.config import BenchConfig, CheckRules, Tolerance
from kevin_exp.bench.verdict import Status, TimingStats, Verdict

__all__ = ["BenchConfig", "CheckRules", "Status", "TimingStats", "Tolerance", "Verdict", "EvalItem", "evaluate", "Evaluator"]


def __getattr__(name: str):
    # The evaluator pulls in subprocess machinery; keep `import kevin_exp.bench` light for workers.
    if name in ("EvalItem", "evaluate", "Evaluator"):
        from kevin_exp.bench import evaluator

        return getattr(evaluator, name)
    raise AttributeError(name)
