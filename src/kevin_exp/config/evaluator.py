"""The ``evaluator`` group: where candidates are evaluated and the bench's protocol settings."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from kevin_exp.bench.config import BenchConfig, CheckRules, Tolerance, _default_tolerances
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


@dataclass
class EvaluatorConfig:
    # auto: cuda when a GPU is visible, else cpu
    backend: str = choice("auto", ("auto", "cpu", "cuda"))
    # local: the evaluator runs on this rank's node; remote: on evaluator workers on other SLURM nodes
    placement: str = choice("local", ("local", "remote"))
    remote: RemoteEvaluatorConfig = field(default_factory=RemoteEvaluatorConfig)
    correctness_trials: int = number(5, ge=1)
    warmup_trials: int = number(5, ge=0)
    timed_trials: int = number(100, ge=1)
    seed: int = 42
    tolerances: dict[str, Tolerance] = field(default_factory=_default_tolerances)
    # informational flag on verdicts above this speedup (the recheck below is what acts)
    excessive_speedup: float = number(10.0, gt=0)
    # a speedup above recheck_speedup is re-timed in a fresh runner on fresh inputs; if the two differ by more
    # than the factor recheck_tolerance the verdict is `suspect` and scores 0
    recheck_speedup: float = number(5.0, gt=0)
    recheck_tolerance: float = number(1.5, ge=1)
    # the time a speedup uses: max(reported (timing_statistic), least outside - calibration overhead - hidden_time_slack_ms),
    # so under-reporting gains at most hidden_time_slack_ms per call; with hidden_time_check, hiding more than
    # hidden_time_factor x the reported time + hidden_time_suspect_ms makes the verdict `suspect`
    hidden_time_check: bool = True
    # the figure a speedup takes from the timed calls, the candidate's and the reference's alike: min (the
    # fastest call; on the GPU the one that repeats) or median
    timing_statistic: str = choice("min", ("min", "median"))
    hidden_time_factor: float = number(0.5, ge=0)
    hidden_time_slack_ms: float = number(0.05, ge=0)
    hidden_time_suspect_ms: float = number(1.0, ge=0)
    # a run the hidden-time check flags is measured again in a fresh runner up to this many times; only a run
    # flagged every time is `suspect`
    hidden_time_retries: int = number(1, ge=0)
    # the reference's timing is cached only when the relative spread of timing_statistic between its blocks is at
    # most reference_max_spread; a noisier one is measured again (reference_retries times, reference_retry_wait_s
    # apart), else used uncached and the verdict says so; a recheck replaces the cached timing only after a third
    # measurement sides with the new one; two agree within the relative reference_agreement. reference_max_spread 0:
    # the backend's own (0.10 on cuda, 0.30 on cpu)
    reference_max_spread: float = number(0.0, ge=0)
    reference_agreement: float = number(0.05, gt=0)
    reference_retries: int = number(2, ge=0)
    reference_retry_wait_s: float = number(1.0, ge=0)
    # hidden checks: extra checked calls on inputs the prompt never shows, at other scales and distributions of
    # the floating inputs (check_distributions) and at a hidden size (hidden_shape_check); see BenchConfig
    check_distributions: bool = True
    hidden_shape_check: bool = True
    # a time below the problem's physical floor (bytes / memory bandwidth, FLOPs / peak) is `suspect`;
    # floor_bandwidth_gbs > 0 replaces the machine's bandwidth, the floor is divided by floor_margin (0: 4 on cpu,
    # 1.5 on cuda)
    physical_floor: bool = True
    floor_bandwidth_gbs: float = number(0.0, ge=0)
    floor_margin: float = number(0.0, ge=0)
    # cap on the speedup term of the reward (0: no cap)
    max_speedup: float = number(0.0, ge=0)
    compile_timeout_s: float = number(300.0, gt=0)
    # the trial phase's deadline: clamp(hang_floor_s + hang_factor x the reference's time for the protocol,
    # hang_floor_s, hang_ceiling_s); loading the candidate has load_timeout_s of its own
    hang_floor_s: float = number(15.0, gt=0)
    hang_factor: float = number(20.0, ge=0)
    hang_ceiling_s: float = number(120.0, gt=0)
    load_timeout_s: float = number(60.0, gt=0)
    # bytes of inputs and expected outputs the reference process prepares at a time
    chunk_bytes: int = number(1 << 30, ge=1)
    # the candidate's runner may not create threads or processes once warm (seccomp)
    forbid_new_tasks: bool = True
    memory_limit_gb: float = number(8.0, gt=0)
    feedback_chars: int = number(2000, ge=0)
    # 0: half the compile cores on cuda, one per core on cpu, within memory / one run slot per GPU (cpu: 1)
    compile_workers: int = number(0, ge=0)
    run_slots: int = number(0, ge=0)
    # cores of its own per run slot, kept free of compiles: 0 none (the default: on the H100 box it gave no
    # throughput, docs/benchmarks.md), -1 auto (2 per slot on cuda where the evaluator has the process's cores and at least
    # 6 stay for compiles, else none)
    run_cores: int = number(0, ge=-1)
    # warm sandboxed workers per run slot (0: cores / (2 x run slots), 2 to 8, on cuda; 1 on cpu)
    standby_workers: int = number(0, ge=0)
    # None: $KEVIN_EXP_CACHE or ~/.cache/kevin_exp (shared across runs on the machine)
    cache_dir: Optional[str] = None
    build_mode: str = choice("fast", ("fast", "torch"))
    sandbox: str = choice("auto", ("auto", "namespace", "process"))
    # fork: each candidate's runner is forked from a warm fork server (torch imported once, not per runner);
    # exec: each starts a fresh interpreter (the way runners start where the server cannot fork)
    worker_start: str = choice("fork", ("fork", "exec"))
    rules: CheckRules = field(default_factory=CheckRules)

    def extra_checks(self, prefix: str) -> list[str]:
        problems = []
        for dtype, tol in self.tolerances.items():
            if tol.atol < 0 or tol.rtol < 0:
                problems.append(f"{prefix}tolerances.{dtype}: atol and rtol must be >= 0")
        if 0 < self.floor_margin < 1:
            problems.append(f"{prefix}floor_margin={self.floor_margin}: expected 0 (the backend's) or >= 1")
        if self.hang_floor_s > self.hang_ceiling_s:
            problems.append(f"{prefix}hang_floor_s={self.hang_floor_s} is above {prefix}hang_ceiling_s="
                            f"{self.hang_ceiling_s}: lower the floor or raise the ceiling")
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
        fields = {f.name for f in dataclasses.fields(BenchConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in fields}
        values.update(backend=self.resolved_backend(), rules=self.rules, tolerances=dict(self.tolerances))
        return BenchConfig(**values)
