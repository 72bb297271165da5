"""The ``evaluator`` group: where candidates are evaluated and the bench's protocol settings.

The bench's settings are declared once, in ``kevin_exp.bench.config.BenchConfig`` (defaults, limits, the checks
across fields); ``EvaluatorConfig`` is derived from it field by field, plus the settings only the run has
(``EvaluatorRunSide``: the backend may be ``auto``, and where the evaluator runs). ``to_bench`` makes the
bench's config back from it."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Optional

from kevin_exp.bench.config import BenchConfig
from kevin_exp.settings_checks import choice, number


@dataclass
class RemoteEvaluatorConfig:
    """``evaluator.placement=remote``: evaluator workers on other SLURM nodes, started and scaled by
    dask-jobqueue (docs/remote-evaluation.md); each runs the same sandboxed node-level evaluator."""

    # SLURM jobs, one evaluator worker (one node's evaluator) each; a job that dies is replaced
    workers: int = number(1, ge=1)
    # cores, memory and GPUs of one worker's job
    cores: int = number(16, ge=1)
    memory_gb: float = number(64.0, gt=0)
    gpus: int = number(1, ge=0)
    # SLURM partition and account (null: the cluster's defaults)
    partition: Optional[str] = None
    account: Optional[str] = None
    walltime_min: int = number(240, ge=1)
    # network interface the workers reach the training job's scheduler on (null: the host's default address)
    interface: Optional[str] = None
    # where the workers' SLURM logs go (null: <run dir>/evaluator-workers)
    log_dir: Optional[str] = None
    # extra `#SBATCH` options, e.g. ["--constraint=h100"]
    job_extra: list[str] = field(default_factory=list)
    # candidates in flight on one worker at once (its compile pool and run slots take them from there)
    in_flight: int = number(64, ge=1)
    # how long the first worker may take to start before the run stops with an error
    start_timeout_s: float = number(600.0, gt=0)


# BenchConfig's settings the run sets itself: the backend (auto resolved here) and the cores (from resources)
SET_BY_THE_RUN = ("backend", "cpus")


@dataclass
class EvaluatorRunSide:
    """The evaluator group's settings that are not the bench's; the rest of ``EvaluatorConfig`` is BenchConfig's."""

    # auto: cuda when a GPU is visible, else cpu
    backend: str = choice("auto", ("auto", "cpu", "cuda"))
    # local: the evaluator runs on this rank's node; remote: on evaluator workers on other SLURM nodes
    placement: str = choice("local", ("local", "remote"))
    remote: RemoteEvaluatorConfig = field(default_factory=RemoteEvaluatorConfig)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = BenchConfig.extra_checks(self, prefix)  # type: ignore[arg-type]
        if self.placement == "remote":
            import importlib.util
            import shutil

            if importlib.util.find_spec("dask_jobqueue") is None:
                problems.append(f"{prefix}placement=remote: dask-jobqueue is not installed; pip install -e '.[remote]'")
            if shutil.which("sbatch") is None:
                problems.append(f"{prefix}placement=remote: no SLURM here (sbatch not found); remote evaluator workers are "
                                "SLURM jobs: run on a cluster's login or compute node, or use placement=local")
        return problems

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def to_bench(self) -> BenchConfig:
        """The bench's config of these settings (``cpus`` at its default: the run sets it from its resources)."""
        values = {f.name: getattr(self, f.name) for f in _bench_fields()}
        values.update(backend=self.resolved_backend(), tolerances=dict(getattr(self, "tolerances")))
        return BenchConfig(**values)


def _bench_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(BenchConfig) if f.name not in SET_BY_THE_RUN]


def _derived_field(f: dataclasses.Field) -> tuple[str, typing.Any, dataclasses.Field]:
    hints = typing.get_type_hints(BenchConfig)
    return f.name, hints[f.name], field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)


# the run's evaluator group: the run-side settings, then every other BenchConfig field with its default and limits
EvaluatorConfig = dataclasses.make_dataclass(
    "EvaluatorConfig", [_derived_field(f) for f in _bench_fields()], bases=(EvaluatorRunSide,),
    namespace={"__module__": __name__, "__doc__": "The run's ``evaluator`` group (derived from BenchConfig)."})
