"""The reward environment: compile, check and time KernelBench-format candidates in sandboxed workers.

This package knows nothing of RL, Hydra or models. Entry points: ``evaluate`` (batch API),
``python -m kevin_exp.bench`` (CLI).

In the evaluator's process, in stage order: ``checks`` (the static rules; ``candidate_source`` finds the
``load_inline`` specs, ``native_source`` reads C++/CUDA as the preprocessor does), ``build`` (compiles and their
cache; the builder is ``build.builder``), ``run_slot`` (the serial run stage: a trusted ``reference_process`` and
the candidate's sandboxed runners, ``worker_process`` with ``sandbox`` and ``uid_lease``), ``protocol`` (one run,
in lockstep between the two: the calls in ``trial_calls``, tensors through ``exchange`` (on cuda the outputs
through ``device_exchange``), what the run left in ``run_outcome``), ``verdict`` (a verdict, built from what a run
left); ``evaluator`` takes a batch through them (``eval_items``: what its stages hand one another). Inside the
reference process: ``reference_server``. Inside each runner: the ``worker`` package.
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
