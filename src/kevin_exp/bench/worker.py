"""Run-stage worker: one process evaluates exactly one candidate, then exits.

Started by ``kevin_exp.bench.sandbox`` ahead of time (a warm standby: torch imported, CUDA context up),
it reads one job from stdin (a random key, then JSON), writes one result as JSON, signed with that
key, to the file descriptor given by ``--result-fd`` and exits. Whatever the candidate does to this
process (segfault, exit, hang, corrupting the CUDA context), the parent sees it from outside and turns it into a verdict.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from kevin_exp.bench.result_channel import read_key, sign_result

SANDBOX_CACHE = "/tmp/.kx-cache"
"""Where the build cache appears, read-only, inside a namespace sandbox."""


def _mount(*args: str) -> None:
    rc = os.spawnvp(os.P_WAIT, "mount", ["mount", *args])
    if rc != 0:
        raise SystemExit(f"sandbox: mount {' '.join(args)} failed")


def _blocking_ancestor(path: Path) -> Path | None:
    """The highest ancestor of ``path`` that others may not traverse (e.g. /root, mode 700)."""
    for parent in reversed(path.parents):
        try:
            if not os.stat(parent).st_mode & 0o001:
                return parent
        except OSError:
            return None
    return None


def _expose_readonly(paths: list[Path]) -> None:
    """Make ``paths`` readable by an unprivileged uid inside this mount namespace, read-only.

    A directory like /root (mode 700) that holds the interpreter is covered by an empty tmpfs, and
    only the needed children are bound back, read-only; everything else under it stays hidden.
    """
    stage = Path("/tmp/.kx-stage")
    covered: dict[Path, Path] = {}
    for path in paths:
        blocker = _blocking_ancestor(path)
        if blocker is None or blocker in covered:
            continue
        staged = stage / str(len(covered))
        staged.mkdir(parents=True)
        _mount("--bind", str(blocker), str(staged))
        _mount("-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", str(blocker))
        covered[blocker] = staged
    for path in paths:
        blocker = _blocking_ancestor(path)
        for b, staged in covered.items():
            if path == b or b not in path.parents:
                continue
            child = b / path.relative_to(b).parts[0]
            if child.exists():
                continue
            child.mkdir()
            _mount("--bind", str(staged / child.name), str(child))
            _mount("-o", "remount,bind,ro", str(child))


def _covered_by_private_tmp(paths: set[Path]) -> list[Path]:
    """The top-level folders under /tmp or /dev/shm that hold any of ``paths`` (e.g. /tmp/ci-clone)."""
    tops = set()
    for path in paths:
        for root in (Path("/tmp"), Path("/dev/shm")):
            if root in path.parents:
                tops.add(root / path.relative_to(root).parts[0])
    return sorted(tops)


def _prepare_sandbox(args: argparse.Namespace) -> None:
    """Inside fresh namespaces as root: private /tmp and /dev/shm, the build cache read-only, the
    interpreter visible, then drop to the slot's uid."""
    if args.private_tmp:
        # Never let a mount made here propagate to the host (older unshare builds or a shared root
        # would otherwise cover the host's /tmp with this worker's empty tmpfs).
        _mount("--make-rprivate", "/")
        cache = Path(args.cache_dir) if args.cache_dir else None
        # Hold the cache open first: it may itself live under /tmp, which the private tmpfs covers.
        cache_fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY) if cache is not None and cache.is_dir() else None
        needed = {Path(sys.base_prefix), Path(sys.prefix), Path(__file__).resolve().parents[2]}
        needed |= {Path(p).resolve() for p in sys.path if p and os.path.isdir(p)}
        # A checkout or venv under /tmp (a CI clone, say) would vanish under the private tmpfs: hold it open
        # too and bind it back, read-only, at the same path.
        held = {d: os.open(d, os.O_RDONLY | os.O_DIRECTORY) for d in _covered_by_private_tmp(needed)}
        for target, size in (("/tmp", "2g"), ("/dev/shm", "1g")):
            if os.path.isdir(target):
                _mount("-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", target)
        for d, fd in held.items():
            os.set_inheritable(fd, True)  # mount(8) opens it through its own /proc/self/fd
            d.mkdir(parents=True, exist_ok=True)
            # --no-canonicalize: resolved to a path, /proc/self/fd/N would name the new, empty folder
            _mount("--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", str(d))
            _mount("-o", "remount,bind,ro", str(d))
            os.close(fd)
        if cache_fd is not None:
            os.set_inheritable(cache_fd, True)
            Path(SANDBOX_CACHE).mkdir(parents=True)
            rc = os.spawnvp(os.P_WAIT, "mount", ["mount", "--no-canonicalize", "--bind", f"/proc/self/fd/{cache_fd}",
                                                  SANDBOX_CACHE])
            if rc != 0:
                raise SystemExit("sandbox: binding the build cache failed")
            os.close(cache_fd)
            _mount("-o", "remount,bind,ro", SANDBOX_CACHE)
        if args.uid is not None:
            _expose_readonly(sorted(needed))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.uid is not None:
        os.chown(workdir, args.uid, args.uid)
        os.setgroups([])
        os.setgid(args.uid)
        os.setuid(args.uid)
    os.chdir(workdir)
    os.environ["HOME"] = str(workdir)
    os.environ["TMPDIR"] = str(workdir)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(workdir / "torch_extensions")
    # The sandbox uid has no passwd entry: getpass.getuser() (torch's inductor/dynamo cache paths
    # call it on first use) reads these before falling back to a lookup that would raise.
    user = f"kx-sandbox-{os.getuid()}"
    os.environ.update(USER=user, LOGNAME=user, TORCHINDUCTOR_CACHE_DIR=str(workdir / "inductor"),
                      TRITON_CACHE_DIR=str(workdir / "triton"), XDG_CACHE_HOME=str(workdir / ".cache"))
    if args.address_space_gb:
        limit = int(args.address_space_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if args.nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_limit = 1 << 30
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kevin_exp.bench.worker")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--backend", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--private-tmp", action="store_true")
    parser.add_argument("--address-space-gb", type=float, default=0.0)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--probe", action="store_true", help="set up the sandbox, import torch (and start CUDA on that backend), exit")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a fatal signal leaves a Python traceback in the output the model sees

    result_pipe = os.fdopen(args.result_fd, "w")
    try:
        _prepare_sandbox(args)
    except BaseException as exc:  # noqa: BLE001 - report, never hang the parent
        result_pipe.write(json.dumps({"worker_error": f"sandbox setup failed: {exc}"}))
        result_pipe.close()
        raise SystemExit(3)

    # Warm up before the job arrives: this is what the standby pays for ahead of time.
    import torch
    import torch.utils.cpp_extension  # noqa: F401  (the candidate's load_inline call imports it: ~0.2-0.3 s)

    import kevin_exp.bench.harness  # noqa: F401  (import everything before the job, as the uid)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backend == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    # The guard's first entry, and an op under it, happen here rather than in the candidate's first forward.
    from kevin_exp.bench.runtime_guard import block_torch_compute

    with block_torch_compute():
        torch.empty(1, device="cuda" if args.backend == "cuda" else "cpu")
    if args.probe:
        import getpass

        result_pipe.write(json.dumps({"probe": "ok", "uid": os.getuid(), "user": getpass.getuser()}))
        result_pipe.close()
        os._exit(0)

    key = read_key(sys.stdin.fileno())
    job = json.loads(sys.stdin.buffer.read())
    result = run_job(job)
    signed = sign_result(key, json.dumps(result).encode())
    key[:] = bytes(len(key))
    # Output first: the parent may end this process as soon as the result pipe closes.
    sys.stdout.flush()
    sys.stderr.flush()
    result_pipe.write(signed.decode())
    result_pipe.flush()
    result_pipe.close()
    # Skip interpreter teardown: a candidate's extension may crash in its destructors.
    os._exit(0)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    from kevin_exp.bench.harness import NeedsBuild, Rejected

    try:
        return _evaluate(job)
    except NeedsBuild as need:
        from dataclasses import asdict

        return {"needs_build": asdict(need.spec)}
    except Rejected as rej:
        return {"status": rej.status, "reason": rej.reason, "rule": rej.rule, "detail": rej.detail}


def _stage(status: str, prefix: str):
    """Turns any exception from a stage into a Rejected verdict with the traceback's last lines."""
    from kevin_exp.bench.harness import NeedsBuild, Rejected

    class _Guard:
        def __enter__(self) -> None:
            return None

        def __exit__(self, exc_type, exc, tb) -> bool:
            if exc is None or isinstance(exc, (Rejected, NeedsBuild)):
                return False
            if not isinstance(exc, Exception):
                return False
            detail = "".join(traceback.format_exception(exc_type, exc, tb)[-6:])
            raise Rejected(status, f"{prefix}: {type(exc).__name__}: {exc}"[:2000], detail=detail) from exc

    return _Guard()


def _evaluate(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from kevin_exp.bench import harness as h
    from kevin_exp.bench.config import BenchConfig, CheckRules, Tolerance
    from kevin_exp.bench.runtime_guard import ForbiddenOpError, block_torch_compute, snapshot_timing_functions, verify_timing_functions

    cfg_dict = dict(job["config"])
    cfg_dict["rules"] = CheckRules(**cfg_dict["rules"])
    cfg_dict["tolerances"] = {k: Tolerance(**v) for k, v in cfg_dict["tolerances"].items()}
    cfg_dict.pop("cache_dir", None)
    config = BenchConfig(**cfg_dict)
    rules = config.rules
    device = torch.device("cuda" if config.backend == "cuda" else "cpu")
    phases: dict[str, float] = {}
    result: dict[str, Any] = {"device": _device_name(device), "phases": phases}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name] = round(now - clock[0], 4)
        clock[0] = now

    # TF32 off: fp32 problems are compared against true fp32 (kevin-recipe.md 5.11).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    with _stage("runtime_error", "the reference program failed"):
        ref_ns = h.load_reference(job["reference"], config.backend)
    timing_snapshot = snapshot_timing_functions()
    calls = h.ExtensionCalls()
    import torch.utils.cpp_extension as cpp_extension

    cpp_extension.load_inline = h.make_load_inline_hook(
        {k: tuple(v) for k, v in job.get("prebuilt", {}).items()}, calls
    )
    with _stage("runtime_error", "loading your module raised"):
        cand_ns = h.exec_module(job["candidate"], "candidate.py")
    if "ModelNew" not in cand_ns:
        raise h.Rejected("format_error", "the code defines no class ModelNew")
    _check_timing_untouched(rules, timing_snapshot, verify_timing_functions)
    lap("load_s")

    with _stage("runtime_error", "the reference program failed"):
        torch.manual_seed(config.seed)
        init_inputs = ref_ns["get_init_inputs"]()
        torch.manual_seed(config.seed)
        ref_model = ref_ns["Model"](*init_inputs).to(device).eval()
    with _stage("runtime_error", "constructing ModelNew raised"):
        torch.manual_seed(config.seed)  # same seed before both constructors, as KernelBench does
        new_model = cand_ns["ModelNew"](*init_inputs).to(device)

    def correctness(seed_offset: int) -> float:
        worst = 0.0
        for trial in range(config.correctness_trials):
            seed = config.seed + seed_offset + 7919 * trial
            inputs = h.make_inputs(ref_ns, seed, device)
            pristine = h.clone_values(inputs)
            with torch.no_grad():
                with _stage("runtime_error", "the reference program failed"):
                    ref_out = ref_model(*h.clone_values(inputs))
                    h.synchronize(device)
                h.poison_allocator(ref_out, device)
                cand_inputs = h.clone_values(inputs)
                guard = block_torch_compute() if rules.runtime_block_torch_ops else _NullGuard()
                calls_before = calls.count
                try:
                    with _stage("runtime_error", "your forward raised"):
                        with guard:
                            out = new_model(*cand_inputs)
                        h.synchronize(device)
                except h.Rejected as rej:
                    blocked = getattr(guard, "violations", None)
                    if blocked or isinstance(rej.__cause__, ForbiddenOpError):
                        op = blocked[0] if blocked else rej.__cause__.op
                        raise h.Rejected("forbidden", f"forward called the PyTorch op {op}; compute must happen in your kernel", rule="runtime_torch_op") from None
                    raise
                if getattr(guard, "violations", None):
                    raise h.Rejected("forbidden", f"forward called the PyTorch op {guard.violations[0]}; compute must happen in your kernel", rule="runtime_torch_op")
            if rules.runtime_require_kernel_call and calls.count == calls_before:
                raise h.Rejected("forbidden", "forward never called a function of the extension built with load_inline", rule="kernel_not_called")
            cmp = h.compare_outputs(ref_out, out, config)
            if not cmp.ok:
                raise h.Rejected("incorrect", f"trial {trial + 1}/{config.correctness_trials}: {cmp.reason}")
            if not h.same_values(cand_inputs, pristine):
                raise h.Rejected("incorrect", f"trial {trial + 1}: forward modified its input tensors in place")
            worst = max(worst, cmp.max_abs_diff)
            del out, ref_out, cand_inputs, pristine, inputs
        return worst

    lap("construct_s")
    max_diff = correctness(0)
    lap("correctness_s")
    tol = config.tolerance_for("float32")
    result.update(correctness_trials=config.correctness_trials, max_abs_diff=max_diff, atol=tol.atol, rtol=tol.rtol)

    input_sets = [h.make_inputs(ref_ns, config.seed + 104729 * (k + 1), device) for k in range(max(1, config.timing_input_sets))]
    with torch.no_grad():
        ref_outputs = [ref_model(*h.clone_values(s)) for s in input_sets]
    with _stage("runtime_error", "your forward raised during timing"):
        lap("timing_inputs_s")
        timing = h.interleaved_timing(ref_model, new_model, input_sets, ref_outputs, device, config)
    lap("timing_s")
    _check_timing_untouched(rules, timing_snapshot, verify_timing_functions)
    # Again after timing, on new inputs: state carried across calls must not change the answer.
    correctness(1_000_003)
    _check_timing_untouched(rules, timing_snapshot, verify_timing_functions)
    lap("recheck_s")

    from kevin_exp.bench.verdict import TimingStats
    from dataclasses import asdict

    new_stats = TimingStats.from_samples(timing.new_ms)
    ref_stats = TimingStats.from_samples(timing.ref_ms)
    result.update(
        status="ok",
        runtime_stats=asdict(new_stats),
        ref_runtime_stats=asdict(ref_stats),
    )
    return result


class _NullGuard:
    violations: list[str] = []

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def _check_timing_untouched(rules, snapshot, verify) -> None:
    from kevin_exp.bench.harness import Rejected

    if not rules.no_timing_patch:
        return
    changed = verify(snapshot)
    if changed:
        raise Rejected("forbidden", f"timing/synchronisation functions were replaced: {', '.join(changed)}", rule="timing_tampered")


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "cpu: " + (platform.processor() or platform.machine())


if __name__ == "__main__":
    main()
