"""Plain dataclasses configuring the evaluator (Hydra-free; the runner builds them from its config)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kevin_exp.settings_checks import number


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
    backend: str = "cpu"  # "cpu" | "cuda"
    correctness_trials: int = 5
    warmup_trials: int = 5
    timed_trials: int = 100
    seed: int = 42
    tolerances: dict[str, Tolerance] = field(default_factory=_default_tolerances)
    # informational flag on a verdict whose speedup is above this (the recheck below is what acts)
    excessive_speedup: float = 10.0
    # a speedup above this is re-timed in a fresh runner with fresh inputs before it counts
    recheck_speedup: float = 5.0
    # the two speedups may differ by at most this factor; more makes the verdict `suspect` (scores 0)
    recheck_tolerance: float = 1.5
    # The parent's clock brackets each timed call alone (docs/hack_defences.md, "Timing protocol"). The time a
    # speedup uses is max(reported (timing_statistic), least outside - least calibration overhead - hidden_time_slack_ms):
    # a runner that under-reports gains at most hidden_time_slack_ms per call. With hidden_time_check, a run is
    # also `suspect` when its calls hide (outside - reported, beyond the calibration's) more than
    # hidden_time_factor x the reported time + hidden_time_suspect_ms: a gross lie, not noise.
    hidden_time_check: bool = True
    # the figure a speedup takes from the timed calls (the candidate's and the reference's alike): "min", the
    # fastest call (each on fresh inputs after a cache flush: on the GPU the figure that repeats, docs/hack_defences.md)
    # or "median"
    timing_statistic: str = "min"
    hidden_time_factor: float = 0.5
    hidden_time_slack_ms: float = 0.05
    hidden_time_suspect_ms: float = 1.0
    # a run the hidden-time check flags is measured again in a fresh runner (new seed, new calibration) up to
    # this many times; only a run flagged every time is `suspect`: a lie repeats, a busy machine's noise rarely
    hidden_time_retries: int = 1
    # The reference's timing (docs/hack_defences.md, "Timing protocol"): measured in blocks and taken with
    # timing_statistic, like the candidate's. It is cached only when the relative spread of that statistic between
    # its blocks is at most reference_max_spread (a quiet machine); a noisier one is measured again up to
    # reference_retries times, reference_retry_wait_s apart, and if none is quiet the quietest is used, not
    # cached, and the verdict says so. A recheck's new measurement replaces the cached one only after a third
    # measurement sides with it; two measurements agree when within the relative reference_agreement (the
    # fidelity goal's worst case, 5%). reference_max_spread 0 is the backend's own: 0.10 on cuda, 0.30 on cpu (a
    # shared CPU's blocks differ by 12-33% under load, where a GPU's agree within a few per cent).
    reference_max_spread: float = 0.0
    reference_agreement: float = 0.05
    reference_retries: int = 2
    reference_retry_wait_s: float = 1.0
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
    floor_bandwidth_gbs: float = 0.0
    floor_margin: float = 0.0
    # reward cap applied where the reward is computed (0: no cap)
    max_speedup: float = 0.0
    compile_timeout_s: float = 300.0
    # the trial phase's deadline: clamp(hang_floor_s + hang_factor x the reference's time for the whole
    # protocol, hang_floor_s, hang_ceiling_s)
    hang_floor_s: float = 15.0
    hang_factor: float = 20.0
    hang_ceiling_s: float = 120.0
    # loading the candidate and constructing ModelNew (it may import a module)
    load_timeout_s: float = 60.0
    # the trusted reference process prepares inputs and expected outputs in chunks of at most this many bytes
    chunk_bytes: int = 1 << 30
    # the candidate's runner may not create threads or processes once warm (kevin_exp.bench.seccomp)
    forbid_new_tasks: bool = True
    # per-worker resident memory limit (cpu backend also gets an address-space limit)
    memory_limit_gb: float = 8.0
    max_output_bytes: int = 1 << 20
    feedback_chars: int = 2000
    max_source_bytes: int = 512 * 1024
    compile_workers: int = 0  # 0: half the cores on cuda, one per core on cpu, within memory
    cpus: int = 0  # cores the evaluator may use (0: all of the machine's)
    run_slots: int = 0  # 0: one per visible GPU (cuda) / 1 (cpu)
    # cores of its own per run slot, kept free of compiles (bench/cpu_split.py); 0: none (the default: on the H100
    # box it gave no throughput); -1: auto (2 per slot on cuda where the evaluator has the process's
    # cores and at least 6 stay for compiles, else none)
    run_cores: int = 0
    # sandboxed workers kept starting per run slot while one runs (a cold start costs ~10 s on a GPU box, a
    # run ~1 s); 0: cores / (2 x run slots), 2 to 8 (cuda) / 1 (cpu, where starting workers would take
    # cores from the timed run)
    standby_workers: int = 0
    cache_dir: Path | None = None  # None: $KEVIN_EXP_CACHE or ~/.cache/kevin_exp
    build_mode: str = "fast"  # "fast" (precompiled headers, lean includes) | "torch" (torch's load_inline)
    sandbox: str = "auto"  # "auto" | "namespace" | "process"
    # "fork": runners are forked from a warm fork server (torch imported once); "exec": each starts a fresh
    # interpreter. Where the server cannot fork, runners start the exec way (the verdict's isolation says so).
    worker_start: str = "fork"
    rules: CheckRules = field(default_factory=CheckRules)

    def __post_init__(self) -> None:
        if self.backend not in ("cpu", "cuda"):
            raise ValueError(f"backend={self.backend!r}: expected 'cpu' or 'cuda'")
        if self.build_mode not in ("fast", "torch"):
            raise ValueError(f"build_mode={self.build_mode!r}: expected 'fast' or 'torch'")
        if self.worker_start not in ("fork", "exec"):
            raise ValueError(f"worker_start={self.worker_start!r}: expected 'fork' or 'exec'")
        if self.timing_statistic not in ("min", "median"):
            raise ValueError(f"timing_statistic={self.timing_statistic!r}: expected 'min' or 'median'")
        if self.sandbox not in ("auto", "namespace", "process"):
            raise ValueError(f"sandbox={self.sandbox!r}: expected 'auto', 'namespace' or 'process'")
        if self.correctness_trials < 1 or self.timed_trials < 1:
            raise ValueError("correctness_trials and timed_trials must be >= 1")
        if not 0 < self.hang_floor_s <= self.hang_ceiling_s:
            raise ValueError(f"hang_floor_s={self.hang_floor_s}, hang_ceiling_s={self.hang_ceiling_s}: expected "
                             "0 < hang_floor_s <= hang_ceiling_s")
        if self.hang_factor < 0 or self.load_timeout_s <= 0:
            raise ValueError("hang_factor must be >= 0 and load_timeout_s > 0")
        if self.recheck_speedup <= 0 or self.recheck_tolerance < 1:
            raise ValueError(f"recheck_speedup={self.recheck_speedup}, recheck_tolerance={self.recheck_tolerance}: "
                             "expected recheck_speedup > 0 and recheck_tolerance >= 1")
        if self.hidden_time_factor < 0 or self.hidden_time_slack_ms < 0 or self.hidden_time_suspect_ms < 0:
            raise ValueError("hidden_time_factor, hidden_time_slack_ms and hidden_time_suspect_ms must be >= 0")
        if self.reference_max_spread < 0 or self.reference_agreement <= 0:
            raise ValueError(f"reference_max_spread={self.reference_max_spread}, reference_agreement="
                             f"{self.reference_agreement}: expected > 0")
        if self.reference_retries < 0 or self.reference_retry_wait_s < 0:
            raise ValueError(f"reference_retries={self.reference_retries}, reference_retry_wait_s="
                             f"{self.reference_retry_wait_s}: expected >= 0")
        if self.hidden_time_retries < 0:
            raise ValueError(f"hidden_time_retries={self.hidden_time_retries}: expected >= 0")
        if self.run_cores < -1:
            raise ValueError(f"run_cores={self.run_cores}: expected -1 (auto), 0 (none) or a number of cores")
        if self.floor_bandwidth_gbs < 0 or not (self.floor_margin == 0 or self.floor_margin >= 1):
            raise ValueError(f"floor_bandwidth_gbs={self.floor_bandwidth_gbs}, floor_margin={self.floor_margin}: expected "
                             "floor_bandwidth_gbs >= 0 (0: the machine's) and floor_margin 0 (the backend's) or >= 1")
        if self.max_speedup < 0 or self.chunk_bytes < 1:
            raise ValueError("max_speedup must be >= 0 (0: no cap) and chunk_bytes >= 1")

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
