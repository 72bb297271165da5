"""KernelBench-format problems: a KernelBench checkout or the built-in suite (no evaluator, no Hydra)."""
from kevin_exp.tasks.loader import UnknownProblemError, builtin_levels, load_builtin, load_kernelbench, select
from kevin_exp.tasks.problem import BACKENDS, BUILTIN_ROOT, Problem

__all__ = [
    "BACKENDS",
    "BUILTIN_ROOT",
    "Problem",
    "UnknownProblemError",
    "builtin_levels",
    "load_builtin",
    "load_kernelbench",
    "select",
]
