"""Batch-first evaluation: static checks, parallel compiles, then sandboxed runs queued over run slots.

    with Evaluator(BenchConfig(backend="cuda")) as ev:
        verdicts = ev.evaluate([EvalItem("level1/3", reference_src, candidate_src), ...])

Compiles (bounded by cores and memory) overlap with runs: a candidate goes to a run slot as soon as
its extensions are built. One run slot per visible GPU (or per configured CPU slot); each slot keeps
standby workers starting so process start-up and CUDA initialisation are off the critical path. A batch
always returns exactly one verdict per item, in order.
"""
from __future__ import annotations

import ast
import json
import os
import queue
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
import dataclasses
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kevin_exp.bench.build import BuildError, Builder, BuildResult
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.messages import trim, trim_compiler_log
from kevin_exp.bench.sandbox import SandboxPolicy, WorkerProcess, probe_policy
from kevin_exp.bench.spec import ExtensionSpec
from kevin_exp.bench.static_checks import check_candidate
from kevin_exp.bench.verdict import Status, TimingStats, Verdict

MAX_BUILD_ROUNDS = 3


@dataclass(frozen=True)
class EvalItem:
    problem_id: str
    reference: str
    candidate: str


@dataclass
class _Pending:
    index: int
    item: EvalItem
    specs: list[ExtensionSpec]
    builds: dict[str, BuildResult]
    compile_s: float = 0.0
    rounds: int = 0


class Evaluator:
    def __init__(self, config: BenchConfig | None = None) -> None:
        self.config = config or BenchConfig()
        cfg = self.config
        self.cache_dir = cfg.resolved_cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.builder = Builder(
            self.cache_dir,
            backend=cfg.backend,
            mode=cfg.build_mode,
            timeout_s=cfg.compile_timeout_s,
            memory_limit_gb=max(cfg.memory_limit_gb, 8.0),
        )
        self.policy: SandboxPolicy = probe_policy(cfg.sandbox, cfg.backend)
        self._compile_pool = ThreadPoolExecutor(max_workers=_compile_workers(cfg), thread_name_prefix="kx-compile")
        self._builds: dict[str, Future] = {}
        self._builds_lock = threading.Lock()
        self._run_root = Path(tempfile.mkdtemp(prefix="kevin_exp_run_"))
        devices = _slot_devices(cfg)
        n_standby = cfg.standby_workers or _default_standby(cfg.backend, len(devices))
        self._slots = [_RunSlot(self, i, dev, n_standby) for i, dev in enumerate(devices)]

    # ------------------------------------------------------------------ public API

    def evaluate(self, items: Sequence[EvalItem], on_verdict: Callable[[Verdict], None] | None = None) -> list[Verdict]:
        """Verdicts in the order of ``items``; ``on_verdict`` (if given) sees each one as soon as it lands."""
        results: list[Verdict | None] = [None] * len(items)
        run_queue: queue.Queue[_Pending | None] = queue.Queue()
        waiting: list[tuple[_Pending, list[Future]]] = []
        for index, item in enumerate(items):
            try:
                verdict, pending, futures = self._prepare(index, item)
            except Exception as exc:  # noqa: BLE001 - an evaluator bug still yields a verdict
                verdict, pending, futures = self._internal_error(item, exc), None, []
            if verdict is not None:
                results[index] = verdict
                if on_verdict is not None:
                    on_verdict(verdict)
            else:
                waiting.append((pending, futures))

        remaining = threading.Semaphore(0)
        n_jobs = len(waiting)

        def finish(index: int, verdict: Verdict) -> None:
            results[index] = verdict
            if on_verdict is not None:
                on_verdict(verdict)
            remaining.release()

        threads = [threading.Thread(target=slot.serve, args=(run_queue, finish), daemon=True) for slot in self._slots]
        for t in threads:
            t.start()
        for pending, futures in waiting:
            self._when_built(pending, futures, run_queue, finish)
        for _ in range(n_jobs):
            remaining.acquire()
        for _ in threads:
            run_queue.put(None)
        for t in threads:
            t.join()
        return [v if v is not None else self._internal_error(items[i], RuntimeError("no verdict")) for i, v in enumerate(results)]

    def close(self) -> None:
        for slot in self._slots:
            slot.close()
        self._compile_pool.shutdown(wait=False, cancel_futures=True)
        import shutil

        shutil.rmtree(self._run_root, ignore_errors=True)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ stages

    def _prepare(self, index: int, item: EvalItem) -> tuple[Verdict | None, _Pending | None, list[Future]]:
        cfg = self.config
        if len(item.candidate.encode("utf-8", "replace")) > cfg.max_source_bytes:
            return self._verdict(item, Status.FORMAT_ERROR, f"candidate source exceeds {cfg.max_source_bytes} bytes"), None, []
        try:
            parsed, violations = check_candidate(item.candidate, cfg.backend, cfg.rules)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
            msg = f"the code does not parse as Python{where}: {type(exc).__name__}: {exc}"
            return self._verdict(item, Status.FORMAT_ERROR, msg), None, []
        if violations:
            v = violations[0]
            text = "\n".join(x.message for x in violations[:5])
            return self._verdict(item, Status.FORBIDDEN, v.message, rule=v.rule, feedback=text), None, []
        if not _defines_model_new(item.candidate):
            return self._verdict(item, Status.FORMAT_ERROR, "the code defines no class ModelNew"), None, []
        pending = _Pending(index, item, list(parsed.specs), {})
        return None, pending, [self._build_future(s) for s in pending.specs]

    def _build_future(self, spec: ExtensionSpec) -> Future:
        key = self.builder.cache_key(spec)
        with self._builds_lock:
            fut = self._builds.get(key)
            if fut is not None and fut.done() and isinstance(fut.result(), BuildResult):
                # built by an earlier batch: this one is a cache hit
                hit: Future = Future()
                hit.set_result(dataclasses.replace(fut.result(), cached=True, seconds=0.0))
                return hit
            if fut is None:
                fut = self._compile_pool.submit(self._build_one, spec)
                self._builds[key] = fut
            return fut

    def _build_one(self, spec: ExtensionSpec) -> BuildResult | BuildError:
        try:
            return self.builder.build(spec)
        except BuildError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001
            return BuildError(f"build failed: {type(exc).__name__}: {exc}", log=str(exc))

    def _when_built(self, pending: _Pending, futures: list[Future], run_queue: queue.Queue, finish) -> None:
        if not futures:
            run_queue.put(pending)
            return
        counter = [len(futures)]
        lock = threading.Lock()

        def done(_: Future) -> None:
            with lock:
                counter[0] -= 1
                if counter[0]:
                    return
            try:
                verdict = self._collect_builds(pending, futures)
            except Exception as exc:  # noqa: BLE001
                verdict = self._internal_error(pending.item, exc)
            if verdict is not None:
                finish(pending.index, verdict)
            else:
                run_queue.put(pending)

        for fut in futures:
            fut.add_done_callback(done)

    def _collect_builds(self, pending: _Pending, futures: list[Future]) -> Verdict | None:
        for spec, fut in zip(pending.specs, futures):
            outcome = fut.result()
            if isinstance(outcome, BuildError):
                log = getattr(outcome, "log", "") or str(outcome)
                return self._verdict(
                    pending.item,
                    Status.COMPILE_ERROR,
                    str(outcome).splitlines()[0][:300] if str(outcome) else "compilation failed",
                    feedback=trim_compiler_log(log, self.config.feedback_chars),
                )
            pending.builds[spec.content_digest()] = outcome
            if self.policy.drop_uid:
                _make_world_readable(self.cache_dir, outcome.so_path)
            pending.compile_s += 0.0 if outcome.cached else outcome.seconds
        return None

    def build_now(self, pending: _Pending, spec: ExtensionSpec) -> Verdict | None:
        """A spec only known at run time (built dynamically by the candidate): build, then rerun."""
        from kevin_exp.bench.static_checks import check_native

        if len(json.dumps(asdict(spec))) > self.config.max_source_bytes:
            return self._verdict(pending.item, Status.FORMAT_ERROR, f"extension sources exceed {self.config.max_source_bytes} bytes")
        violations = check_native(spec, self.config.backend, self.config.rules)
        if violations:
            v = violations[0]
            return self._verdict(pending.item, Status.FORBIDDEN, v.message, rule=v.rule)
        pending.specs.append(spec)
        fut = self._build_future(spec)
        fut.result()
        return self._collect_builds(pending, [self._build_future(s) for s in pending.specs])

    # ------------------------------------------------------------------ verdicts

    def _verdict(self, item: EvalItem, status: Status, reason: str, rule: str | None = None, feedback: str = "", **kw: Any) -> Verdict:
        return Verdict(
            problem_id=item.problem_id,
            status=status,
            reason=reason,
            rule=rule,
            feedback=trim(feedback or reason, self.config.feedback_chars),
            backend=self.config.backend,
            isolation=self.policy.describe(),
            **kw,
        )

    def _internal_error(self, item: EvalItem, exc: BaseException) -> Verdict:
        return self._verdict(item, Status.CRASHED, f"evaluator error: {type(exc).__name__}: {exc}")

    def verdict_from_run(self, pending: _Pending, outcome, run_s: float) -> Verdict:
        cfg = self.config
        item = pending.item
        res = outcome.result or {}
        common = dict(compile_s=pending.compile_s, run_s=run_s, cache_hit=all(b.cached for b in pending.builds.values()), device=res.get("device", ""))
        if outcome.forged:
            return self._verdict(item, Status.FORBIDDEN, "something other than the evaluator wrote to the worker's result "
                                 "channel (a forged result); the run counts for nothing", rule="result_forged", **common)
        if outcome.timed_out:
            return self._verdict(item, Status.TIMEOUT, f"the run exceeded its {cfg.run_timeout_s:.0f} s limit (infinite loop or deadlock?)", **common)
        if outcome.memory_exceeded:
            return self._verdict(item, Status.CRASHED, f"the run exceeded the {cfg.memory_limit_gb:g} GB memory limit", **common)
        if "status" not in res:
            sig = outcome.signal_name()
            how = f"killed by {sig}" if sig else f"exited with code {outcome.returncode}"
            if res.get("worker_error"):
                how = res["worker_error"]
            tail = trim(outcome.output_tail, cfg.feedback_chars // 2)
            reason = f"the process running your code {how} before reporting a result"
            if "CUDA error" in outcome.output_tail or "illegal memory access" in outcome.output_tail:
                reason += " (CUDA error)"
            return self._verdict(item, Status.CRASHED, reason, feedback=reason + ("\n" + tail if tail else ""), **common)
        status = Status(res["status"])
        extra_fields = {k: res[k] for k in ("correctness_trials", "max_abs_diff", "atol", "rtol") if k in res}
        if res.get("phases"):
            # where the worker's time went (seconds per stage), for profiling the run stage
            extra_fields["extra"] = {"phases": res["phases"]}
        if status is not Status.OK:
            feedback = res.get("reason", "")
            if res.get("detail") and status is Status.RUNTIME_ERROR:
                feedback += "\n" + res["detail"]
            return self._verdict(item, status, res.get("reason", ""), rule=res.get("rule"), feedback=feedback, **common, **extra_fields)
        new = TimingStats(**res["runtime_stats"])
        ref = TimingStats(**res["ref_runtime_stats"])
        speedup = ref.median_ms / new.median_ms if new.median_ms > 0 else float("inf")
        flagged = speedup > cfg.excessive_speedup
        reason = f"correct; speedup {speedup:.3g}x over PyTorch eager ({ref.median_ms:.4g} ms -> {new.median_ms:.4g} ms)"
        if flagged:
            reason += f"; flagged: speedup above {cfg.excessive_speedup:g}x"
        return self._verdict(
            item,
            Status.OK,
            reason,
            correct=True,
            runtime_ms=new.median_ms,
            ref_runtime_ms=ref.median_ms,
            speedup=speedup,
            runtime_stats=new,
            ref_runtime_stats=ref,
            excessive_speedup=flagged,
            **common,
            **extra_fields,
        )

    def job_for(self, pending: _Pending) -> dict[str, Any]:
        cfg = asdict(self.config)
        cfg["cache_dir"] = None
        return {
            "reference": pending.item.reference,
            "candidate": pending.item.candidate,
            "config": _jsonable(cfg),
            "prebuilt": {d: [self._worker_path(b.so_path), b.module_name] for d, b in pending.builds.items()},
        }


    def _worker_path(self, so_path: Path) -> str:
        """Where the worker sees a built module (namespace sandboxes mount the cache read-only)."""
        if self.policy.mode == "namespace":
            from kevin_exp.bench.worker import SANDBOX_CACHE

            return str(Path(SANDBOX_CACHE) / Path(so_path).resolve().relative_to(self.cache_dir.resolve()))
        return str(so_path)


class _RunSlot:
    """A run slot owns one device (or CPU share) and runs one candidate at a time, each in a fresh worker;
    a few workers keep starting up meanwhile, so a worker's cold start is not paid per candidate."""

    def __init__(self, evaluator: Evaluator, index: int, device: str | None, n_standby: int) -> None:
        self.ev, self.index, self.device, self.n_standby = evaluator, index, device, n_standby
        self._standby: deque[WorkerProcess] = deque()
        self._reapers: list[threading.Thread] = []

    def _take(self) -> WorkerProcess:
        while self._standby:
            worker = self._standby.popleft()
            if worker.alive():
                return worker
            worker.close()
        return self._spawn()

    def _top_up(self) -> None:
        while len(self._standby) < self.n_standby:
            self._standby.append(self._spawn())

    def _spawn(self) -> WorkerProcess:
        cfg = self.ev.config
        threads = max(1, (os.cpu_count() or 1) // len(self.ev._slots)) if cfg.backend == "cpu" else 0
        return WorkerProcess(
            self.ev.policy,
            cfg.backend,
            self.index,
            self.ev._run_root,
            cuda_device=self.device,
            cache_dir=self.ev.cache_dir,
            memory_limit_gb=cfg.memory_limit_gb,
            threads=threads,
            max_output_bytes=cfg.max_output_bytes,
        )

    def serve(self, run_queue: queue.Queue, finish) -> None:
        # Workers start while the batch's first compiles run, not after the first one is built.
        self._top_up()
        while True:
            pending = run_queue.get()
            if pending is None:
                return
            try:
                verdict = self._run(pending)
            except Exception as exc:  # noqa: BLE001
                verdict = self.ev._internal_error(pending.item, exc)
            if verdict is not None:
                finish(pending.index, verdict)

    def _run(self, pending: _Pending) -> Verdict:
        while True:
            worker = self._take()
            if self.ev.config.backend == "cuda":
                self._top_up()  # the next ones start while this one runs (on CPU they would take the timed run's cores)
            t0 = time.monotonic()
            outcome = worker.run(self.ev.job_for(pending), self.ev.config.run_timeout_s)
            run_s = time.monotonic() - t0
            self._retire(worker)
            self._top_up()
            need = (outcome.result or {}).get("needs_build")
            if need is None:
                return self.ev.verdict_from_run(pending, outcome, run_s)
            pending.rounds += 1
            if pending.rounds > MAX_BUILD_ROUNDS:
                return self.ev._verdict(pending.item, Status.RUNTIME_ERROR, "load_inline was called with new sources on every run")
            spec = ExtensionSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in need.items()})
            verdict = self.ev.build_now(pending, spec)
            if verdict is not None:
                return verdict

    def _retire(self, worker: WorkerProcess) -> None:
        """The worker has reported (or died): kill it and reap it off the critical path."""
        reaper = worker.close(wait=False)
        self._reapers = [r for r in self._reapers if r.is_alive()]
        if reaper is not None:
            self._reapers.append(reaper)

    def close(self) -> None:
        while self._standby:
            self._standby.popleft().close()
        for reaper in self._reapers:
            reaper.join(timeout=15)
        self._reapers.clear()


def _make_world_readable(root: Path, so_path: Path) -> None:
    """The sandbox uid reads built modules through the read-only cache mount."""
    import stat

    path = Path(so_path)
    targets = [path] + [p for p in path.parents if p == root or root in p.parents]
    for p in targets:
        try:
            mode = os.stat(p).st_mode
            extra = stat.S_IROTH | (stat.S_IXOTH if p.is_dir() else 0)
            if mode & extra != extra:
                os.chmod(p, mode | extra)
        except OSError:
            pass


def _defines_model_new(source: str) -> bool:
    tree = ast.parse(source)
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _compile_workers(cfg: BenchConfig) -> int:
    if cfg.compile_workers > 0:
        return cfg.compile_workers
    cores = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        mem_gb = 8.0
    per_build_gb = 3.0 if cfg.backend == "cuda" else 1.5  # peak RSS of one build (environment.md)
    return max(1, min(cores, int(mem_gb // per_build_gb)))


def _default_standby(backend: str, n_slots: int) -> int:
    """Workers starting ahead per run slot. A GPU run takes ~1 s and a cold worker ~10 s, so one slot
    needs several starting at once to stay busy; half the cores, shared by the slots, keeps the rest for
    compiles."""
    if backend != "cuda":
        return 1
    return max(2, min(8, (os.cpu_count() or 1) // (2 * max(1, n_slots))))


def _slot_devices(cfg: BenchConfig) -> list[str | None]:
    if cfg.backend == "cpu":
        return [None] * max(1, cfg.run_slots or 1)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        import torch

        devices = [str(i) for i in range(torch.cuda.device_count())]
    if not devices:
        raise RuntimeError("backend=cuda but no GPU is visible: use backend=cpu or run on a GPU machine")
    n = cfg.run_slots or len(devices)
    return [devices[i % len(devices)] for i in range(n)]


def evaluate(items: Sequence[EvalItem], config: BenchConfig | None = None) -> list[Verdict]:
    """One-shot convenience wrapper around :class:`Evaluator`."""
    with Evaluator(config) as ev:
        return ev.evaluate(items)
