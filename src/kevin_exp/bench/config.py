"""Plain dataclasses configuring the evaluator (Hydra-free).

``BenchConfig`` is the one declaration of the evaluator's settings: each field says what it accepts
(``choice``/``number``), and one validator (``check_settings``: those limits and ``extra_checks``) refuses a bad
value whenever one is made. The run's ``evaluator`` group is derived from it field by field
(``kevin_exp/config/evaluator.py``), so composition checks the same declarations."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kevin_exp.settings_checks import check_settings, choice, number


@dataclass(frozen=True)
class CheckRules:
    """Kevin's hack defences (paper App. F and section 6.2), each switchable for ablations.

    Static rules run on the candidate's Python AST and on its C++/CUDA sources; the runtime rules
    run inside the worker while ``ModelNew.forward`` executes.
    """

    # no torch.nn modules / torch.nn.functional (except Parameter, Module, containers, init)
    no_torch_nn: bool = True
    # no torch compute ops in Python (allow-list of allocation / view / shape helpers)
    no_torch_compute: bool = True
    # no try/except (fallback-to-PyTorch hack)
    no_try_except: bool = True
    # no `pass` (inherit-the-reference-and-pass hack)
    no_pass: bool = True
    # ModelNew may not subclass the reference Model
    no_reference_subclass: bool = True
    # a real kernel must be present (cuda: a launched __global__; cpu: a bound C++ function)
    require_kernel: bool = True
    # no ATen/torch compute calls and no vendor libraries (cuBLAS, cuDNN, ...) in C++/CUDA sources
    no_native_library_compute: bool = True
    # no threads, processes or streams created from Python
    no_concurrency: bool = True
    # no reassignment of timing / synchronisation functions
    no_timing_patch: bool = True
    # only an allow-list of modules may be imported (torch, math, ...): blocks os/sys/ctypes tampering
    restrict_imports: bool = True
    # runtime: torch compute ops raise while ModelNew.forward runs (catches `x @ w`, tensor methods)
    runtime_block_torch_ops: bool = True
    # runtime: the extension built by the candidate must actually be called by forward (decoy kernels)
    runtime_require_kernel_call: bool = True
    # runtime: framework flags that change numerics or kernels (TF32, matmul precision, cuDNN benchmark and
    # determinism, oneDNN, thread counts, flush-to-zero) are read before the candidate loads and after every call;
    # a change is `forbidden` (bench/worker/framework_flags.py)
    framework_flags: bool = True
    # Bounds on the static checking itself (docs/static-rules.md); past one the verdict is `forbidden` with
    # rule `check_deadline` / `too_large`. 0 turns a bound off (ablations only: a candidate can then stall the
    # evaluator). Wall-clock limit for checking one candidate or one extension, enforced by a checker process
    # that is killed when it runs over.
    static_check_deadline_s: float = number(10.0, ge=0)
    # candidate source (UTF-8 bytes), AST nodes and AST nesting depth
    max_check_source_bytes: int = number(512 * 1024, ge=0)
    max_ast_nodes: int = number(50_000, ge=0)
    max_ast_depth: int = number(120, ge=0)
    # extension text (all sources and flags of one load_inline call, as folded) and its number of sources
    max_extension_bytes: int = number(256 * 1024, ge=0)
    max_extension_sources: int = number(32, ge=0)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


def _default_tolerances() -> dict[str, Tolerance]:
    # Kevin-era KernelBench used atol = rtol = 1e-2 for fp32 (KernelBench's own default).
    return {
        "float32": Tolerance(1e-2, 1e-2),
        "float64": Tolerance(1e-5, 1e-5),
        "float16": Tolerance(2e-2, 2e-2),
        "bfloat16": Tolerance(5e-2, 5e-2),
    }


@dataclass(frozen=True)
class BenchConfig:
    backend: str = choice("cpu", ("cpu", "cuda"))
    correctness_trials: int = number(5, ge=1)
    warmup_trials: int = number(5, ge=0)
    timed_trials: int = number(100, ge=1)
    seed: int = 42
    tolerances: dict[str, Tolerance] = field(default_factory=_default_tolerances)
    # informational flag on a verdict whose speedup is above this (the recheck below is what acts)
    excessive_speedup: float = number(10.0, gt=0)
    # a speedup above this is re-timed in a fresh runner with fresh inputs before it counts
    recheck_speedup: float = number(5.0, gt=0)
    # the two speedups may differ by at most this factor; more makes the verdict `suspect` (scores 0)
    recheck_tolerance: float = number(1.5, ge=1)
    # The parent's clock brackets each timed call alone (docs/hack_defences.md, "Timing protocol"). The time a
    # speedup uses is max(reported (timing_statistic), least outside - least calibration overhead - hidden_time_slack_ms):
    # a runner that under-reports gains at most hidden_time_slack_ms per call. With hidden_time_check, a run is
    # also `suspect` when its calls hide (outside - reported, beyond the calibration's) more than
    # hidden_time_factor x the reported time + hidden_time_suspect_ms: a gross lie, not noise.
    hidden_time_check: bool = True
    # the figure a speedup takes from the timed calls (the candidate's and the reference's alike): "min", the
    # fastest call (each on fresh inputs after a cache flush: on the GPU the figure that repeats, docs/hack_defences.md)
    # or "median"
    timing_statistic: str = choice("min", ("min", "median"))
    hidden_time_factor: float = number(0.5, ge=0)
    hidden_time_slack_ms: float = number(0.05, ge=0)
    hidden_time_suspect_ms: float = number(1.0, ge=0)
    # ... unless some task waited for a CPU during a larger share of the trials than of the calibration calls, by
    # more than this (bench/cpu_pressure.py): load that came later stretched the path; the run is not accused (its
    # speedup still takes the outside clock's bound), extra["hidden_time_inconclusive"] says so, and it is measured
    # again like a flagged run
    hidden_time_contention: float = number(0.1, ge=0, le=1)
    # a run the hidden-time check flags is measured again in a fresh runner (new seed, new calibration) up to
    # this many times; only a run flagged every time is `suspect`: a lie repeats, a busy machine's noise rarely
    hidden_time_retries: int = number(1, ge=0)
    # The reference's timing (docs/hack_defences.md, "Timing protocol"): measured in blocks and taken with
    # timing_statistic, like the candidate's. It is cached only when the relative spread of that statistic between
    # its blocks is at most reference_max_spread (a quiet machine); a noisier one is measured again up to
    # reference_retries times, reference_retry_wait_s apart, and if none is quiet the quietest is used, not
    # cached, and the verdict says so. A recheck's new measurement replaces the cached one only after a third
    # measurement sides with it; two measurements agree when within the relative reference_agreement (the
    # fidelity goal's worst case, 5%). reference_max_spread 0 is the backend's own: 0.10 on cuda, 0.30 on cpu (a
    # shared CPU's blocks differ by 12-33% under load, where a GPU's agree within a few per cent).
    reference_max_spread: float = number(0.0, ge=0)
    # ... and only when some task waited for a CPU during at most this share of its wall time (bench/cpu_pressure.py):
    # oversubscribed cores (compiles beside it, a policy generating) slow every block alike, so the spread stays low
    # while the figure is many times the truth (a 0.45 ms reference timed at 62 ms during compiles on 2 cores)
    reference_max_contention: float = number(0.25, ge=0, le=1)
    reference_agreement: float = number(0.05, gt=0)
    reference_retries: int = number(2, ge=0)
    reference_retry_wait_s: float = number(1.0, ge=0)
    # Hidden checks (bench/hidden_checks.py): extra checked calls, untimed, on inputs the prompt never shows: the
    # floating inputs at x1e-3 and x1e3, heavy-tailed (clipped Cauchy) and with sparse spikes
    # (check_distributions), and at a hidden size of the problem (hidden_shape_check: module-level integer sizes
    # only get_inputs reads). One the reference is undefined on is skipped for the problem, and the verdict says so.
    check_distributions: bool = True
    hidden_shape_check: bool = True
    # A time below the problem's physical floor (bytes beyond twice the caches / memory bandwidth; FLOPs / peak where
    # both are known) is `suspect` (rule below_physical_floor, bench/physical_floor.py). floor_bandwidth_gbs > 0
    # replaces the machine's bandwidth (cuda: the device's rated figure; cpu: a copy measured once per evaluator);
    # the floor is further divided by floor_margin (0: 4 on cpu, 1.5 on cuda)
    physical_floor: bool = True
    floor_bandwidth_gbs: float = number(0.0, ge=0)
    floor_margin: float = number(0.0, ge=0)
    compile_timeout_s: float = number(300.0, gt=0)
    # the trial phase's deadline: clamp(hang_floor_s + hang_factor x the reference's time for the whole
    # protocol, hang_floor_s, hang_ceiling_s)
    hang_floor_s: float = number(15.0, gt=0)
    hang_factor: float = number(20.0, ge=0)
    hang_ceiling_s: float = number(120.0, gt=0)
    # loading the candidate and constructing ModelNew (it may import a module)
    load_timeout_s: float = number(60.0, gt=0)
    # the trusted reference process prepares inputs and expected outputs in chunks of at most this many bytes
    chunk_bytes: int = number(1 << 30, ge=1)
    # cuda: each call's output and post-call inputs are copied device to device into an allocation the reference
    # process reads in place (bench/device_exchange.py); false: through page-locked host memory (12-16 ms a call
    # for a 256 MiB output and input on an H100)
    device_exchange: bool = True
    # the candidate's runner may not create threads or processes once warm (kevin_exp.bench.seccomp)
    forbid_new_tasks: bool = True
    # per-worker resident memory limit (cpu backend also gets an address-space limit)
    memory_limit_gb: float = number(8.0, gt=0)
    max_output_bytes: int = number(1 << 20, ge=1)
    feedback_chars: int = number(2000, ge=0)
    max_source_bytes: int = number(512 * 1024, ge=1)
    compile_workers: int = number(0, ge=0)  # 0: half the cores on cuda, one per core on cpu, within memory
    cpus: int = number(0, ge=0)  # cores the evaluator may use (0: all of the machine's)
    run_slots: int = number(0, ge=0)  # 0: one per visible GPU (cuda) / 1 (cpu)
    # cores of its own per run slot, kept free of compiles (bench/cpu_split.py); 0: none (the default: on the H100
    # box it gave no throughput); -1: auto (2 per slot on cuda where the evaluator has the process's
    # cores and at least 6 stay for compiles, else none)
    run_cores: int = number(0, ge=-1)
    # sandboxed workers kept starting per run slot while one runs (a cold start costs ~10 s on a GPU box, a
    # run ~1 s); 0: cores / (2 x run slots), 2 to 8 (cuda) / 1 (cpu, where starting workers would take
    # cores from the timed run)
    standby_workers: int = number(0, ge=0)
    # a folder (a str or a Path); None: $KEVIN_EXP_CACHE or ~/.cache/kevin_exp (shared across runs on the machine)
    cache_dir: Optional[str] = None
    # fast (precompiled headers, lean includes) | torch (torch's load_inline)
    build_mode: str = choice("fast", ("fast", "torch"))
    sandbox: str = choice("auto", ("auto", "namespace", "process"))
    # "fork": runners are forked from a warm fork server (torch imported once); "exec": each starts a fresh
    # interpreter. Where the server cannot fork, runners start the exec way (the verdict's isolation says so).
    worker_start: str = choice("fork", ("fork", "exec"))
    rules: CheckRules = field(default_factory=CheckRules)

    def __post_init__(self) -> None:
        problems = check_settings(self)
        if problems:
            raise ValueError("; ".join(problems))

    def extra_checks(self, prefix: str) -> list[str]:
        """The rules across fields (``check_settings`` calls it; the run's evaluator group shares it)."""
        problems = []
        for dtype, tol in self.tolerances.items():
            if tol.atol < 0 or tol.rtol < 0:
                problems.append(f"{prefix}tolerances.{dtype}: atol and rtol must be >= 0")
        if 0 < self.floor_margin < 1:
            problems.append(f"{prefix}floor_margin={self.floor_margin}: expected 0 (the backend's) or >= 1")
        if self.hang_floor_s > self.hang_ceiling_s:
            problems.append(f"{prefix}hang_floor_s={self.hang_floor_s} is above {prefix}hang_ceiling_s="
                            f"{self.hang_ceiling_s}: lower the floor or raise the ceiling")
        return problems

    @property
    def max_reference_spread(self) -> float:
        """``reference_max_spread``, or the backend's own where it is 0."""
        return self.reference_max_spread or (0.10 if self.backend == "cuda" else 0.30)

    def tolerance_for(self, dtype_name: str) -> Tolerance:
        return self.tolerances.get(dtype_name, self.tolerances["float32"])

    def resolved_cache_dir(self) -> Path:
        import os

        if self.cache_dir is not None:
            return Path(self.cache_dir)
        env = os.environ.get("KEVIN_EXP_CACHE")
        return Path(env) if env else Path.home() / ".cache" / "kevin_exp"
