"""Batch-first evaluation: static checks, parallel compiles, then runs queued over run slots.

    with Evaluator(BenchConfig(backend="cuda")) as ev:
        verdicts = ev.evaluate([EvalItem("level1/3", reference_src, candidate_src), ...])

Compiles (bounded by cores and memory) overlap with runs: a candidate goes to a run slot as soon as
its extensions are built. One run slot per visible GPU (or per configured CPU slot); each slot keeps a warm
trusted reference process and standby sandboxed runners starting, so process start-up and CUDA
initialisation are off the critical path. A batch always returns exactly one verdict per item, in order.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import queue
import tempfile
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from kevin_exp.bench import cpu_split
from kevin_exp.bench.build import failures, spec_check
from kevin_exp.bench.build.builder import Builder, BuildError, BuildResult
from kevin_exp.bench.checks import check_candidate
from kevin_exp.bench.checks.native import check_native
from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.eval_items import WAKE, EvalItem, Pending, ReferencesAhead, evaluate_in_session
from kevin_exp.bench.fork_client import ForkServer
from kevin_exp.bench.messages import trim_compiler_log
from kevin_exp.bench.protocol import RunJob
from kevin_exp.bench.run_slot import (
    RunSlot,
    default_standby,
    slot_devices,
    usable_cores,
    worker_threads,
)
from kevin_exp.bench.sandbox import SandboxPolicy, probe_policy
from kevin_exp.bench.spec import ExtensionSpec
from kevin_exp.bench.verdict import (
    Status,
    Verdict,
    apply_recheck,
    apply_remeasure,
    make_verdict,
    needs_recheck,
    needs_remeasure,
    verdict_from_run,
)
from kevin_exp.bench.worker.sandbox_setup import SANDBOX_CACHE

MAX_BUILD_ROUNDS = 3


class Evaluator:
    def __init__(self, config: BenchConfig | None = None) -> None:
        self.config = config or BenchConfig()
        self._stopped = False
        cfg = self.config
        self.cache_dir = cfg.resolved_cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        devices = slot_devices(cfg)
        self.cpu_split = cpu_split.plan(cfg.run_cores, len(devices), cfg.backend, cfg.cpus)
        compile_cores = len(self.cpu_split.compiles) if self.cpu_split.active else usable_cores(cfg.cpus)
        self.builder = Builder(
            self.cache_dir,
            backend=cfg.backend,
            mode=cfg.build_mode,
            timeout_s=cfg.compile_timeout_s,
            memory_limit_gb=max(cfg.memory_limit_gb, 8.0),
            jobs=compile_cores,
        )
        self.policy: SandboxPolicy = probe_policy(cfg.sandbox, cfg.backend)
        # compile threads, and the compilers they start (a thread's affinity is inherited), stay off the run cores
        self._compile_pool = ThreadPoolExecutor(max_workers=_compile_workers(cfg, compile_cores),
                                                thread_name_prefix="kx-compile", initializer=cpu_split.pin_thread,
                                                initargs=(self.cpu_split.compiles,))
        self._builds: dict[str, Future] = {}
        self._builds_lock = threading.Lock()
        self._references_ahead = ReferencesAhead()
        self._run_root = Path(tempfile.mkdtemp(prefix="kevin_exp_run_"))
        # runners are forked from a warm server (no interpreter start or torch import per candidate)
        self.fork_server = (ForkServer(cfg.backend, self._run_root, self.cpu_split.compiles)
                            if cfg.worker_start == "fork" else None)
        n_standby = cfg.standby_workers or default_standby(cfg.backend, len(devices), usable_cores(cfg.cpus))
        threads = worker_threads(cfg.backend, len(devices), usable_cores(cfg.cpus), self.cpu_split)
        self._slots = [
            RunSlot(i, dev, n_standby, policy=self.policy, config=cfg, run_root=self._run_root,
                    cache_dir=self.cache_dir, threads=threads, fork_server=self.fork_server,
                    cpus=self.cpu_split.slot(i), standby_cpus=self.cpu_split.compiles)
            for i, dev in enumerate(devices)
        ]
        _open.add(self)

    # ------------------------------------------------------------------ public API

    def evaluate(self, items: Sequence[EvalItem], on_verdict: Callable[[Verdict], None] | None = None) -> list[Verdict]:
        """Verdicts in the order of ``items``; ``on_verdict`` (if given) sees each one as soon as it lands."""
        return evaluate_in_session(self.session(), items, on_verdict, self._internal_error)

    def session(self) -> "EvalSession":
        """A stream of evaluations: items submitted at any time, each verdict handed to its callback as soon as it
        lands (the run slots are served for the session's life). One session at a time per evaluator."""
        return EvalSession(self)

    def isolation(self) -> str:
        """The sandbox level and how runners start, as a verdict records them."""
        start = self.fork_server.describe() if self.fork_server is not None else "exec"
        return f"{self.policy.describe()}; runners start by {start}"

    def stop(self) -> None:
        """A Ctrl-C (``run/signals.py``, in the signal handler: no lock, no wait): no run starts, the runners alive are
        killed, each candidate waiting gets a verdict at once (nothing waits for one); ``close`` ends the rest."""
        self._stopped = True
        for slot in self._slots:
            slot.stop()
        if self.fork_server is not None:
            self.fork_server.stop()

    def close(self) -> None:
        _open.discard(self)
        for slot in self._slots:
            slot.close()
        if self.fork_server is not None:
            self.fork_server.close()
        self._compile_pool.shutdown(wait=False, cancel_futures=True)
        import shutil

        shutil.rmtree(self._run_root, ignore_errors=True)

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ stages

    def _prepare(self, index: int, item: EvalItem) -> tuple[Verdict | None, Pending | None, list[Future]]:
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
        pending = Pending(index, item, list(parsed.specs), {})
        return None, pending, [self._build_future(s) for s in pending.specs]

    def _build_future(self, spec: ExtensionSpec) -> Future:
        key = self.builder.cache_key(spec)
        with self._builds_lock:
            fut = self._builds.get(key)
            if fut is not None and fut.done() and isinstance(fut.result(), BuildError) \
                    and fut.result().kind != failures.SOURCE:
                fut = None  # a failure that was not the sources' is never replayed: build again
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
            return BuildError(f"build failed: {type(exc).__name__}: {exc}", log=str(exc), kind=failures.INFRA)

    def _when_built(self, pending: Pending, futures: list[Future], run_queue: queue.Queue, finish) -> None:
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

    def _collect_builds(self, pending: Pending, futures: list[Future]) -> Verdict | None:
        for spec, fut in zip(pending.specs, futures):
            outcome = fut.result()
            if isinstance(outcome, BuildError):
                return self._build_failed(pending.item, outcome)
            pending.builds[spec.content_digest()] = outcome
            if self.policy.drop_uid:
                _make_world_readable(self.cache_dir, outcome.so_path)
            pending.compile_s += 0.0 if outcome.cached else outcome.seconds
        return None

    def _build_failed(self, item: EvalItem, error: BuildError) -> Verdict:
        """The verdict of a failed build: the candidate's compile error (only the compiler's diagnostics about its
        sources are fed back), a refused spec, or the machine's failure (not the candidate's mistake: nothing of
        the build's log is fed back)."""
        summary = str(error).splitlines()[0][:300] if str(error) else "compilation failed"
        extra = {"build_attempts": error.attempts, "build_failure": error.kind, "build_limits_s": error.limits_s}
        if error.kind == failures.INFRA:
            return self._verdict(item, Status.INFRA_ERROR, f"the evaluator could not build this candidate ({summary})",
                                 extra=extra)
        if error.kind == failures.REFUSED:
            return self._verdict(item, Status.FORBIDDEN, summary, rule="build_inputs", feedback=summary, extra=extra)
        return self._verdict(item, Status.COMPILE_ERROR, summary, extra=extra,
                             feedback=trim_compiler_log(error.diagnostics or summary, self.config.feedback_chars))

    def build_now(self, pending: Pending, spec: ExtensionSpec) -> Verdict | None:
        """A spec only known at run time (built dynamically by the candidate): build, then rerun."""
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

    # ------------------------------------------------------------------ runs

    def _serve(self, slot: RunSlot, run_queue: queue.Queue[Pending | None],
               finish: Callable[[int, Verdict], None]) -> None:
        """A run slot's thread: the built candidates, one at a time, until the queue says stop."""
        slot.start()  # workers start while the batch's first compiles run, not after the first one is built
        while True:
            pending = self._next_run(slot, run_queue)
            if pending is None:
                return
            try:
                verdict = self._run(slot, pending)
            except Exception as exc:  # noqa: BLE001
                verdict = self._internal_error(pending.item, exc)
            finish(pending.index, verdict)

    def _next_run(self, slot: RunSlot, run_queue: queue.Queue) -> Pending | None:
        """The next built candidate (None: stop). While none is waiting, the slot times the references of submitted
        candidates still building: their first runs then find the timing cached instead of measuring it on the
        slot's critical path."""
        while True:
            try:
                pending = run_queue.get_nowait()
            except queue.Empty:
                source = self._references_ahead.take() if not self._stopped else None
                if source is not None:
                    with contextlib.suppress(Exception):  # a failing reference is left for the problem's runs to report
                        slot.time_reference(source)
                    continue
                pending = run_queue.get()
            if pending is not WAKE:
                return pending

    def _run(self, slot: RunSlot, pending: Pending) -> Verdict:
        """Run a candidate; a spec it only builds at run time is checked and built, then it runs again. A run the
        hidden-time check flags is measured again in a fresh runner (``hidden_time_retries``); a speedup above
        ``recheck_speedup`` is re-timed in a fresh runner on fresh inputs before it counts."""
        if self._stopped:  # a Ctrl-C: never run, and the verdict is never recorded
            return self._verdict(pending.item, Status.INFRA_ERROR, "the evaluation was stopped (Ctrl-C)")
        while True:
            outcome, run_s = slot.run(self._job(pending))
            if outcome.needs_build is None:
                verdict = self._judge(pending, outcome, run_s)
                attempts = 1
                while needs_remeasure(verdict, attempts, self.config):
                    outcome, again_s = slot.run(self._job(pending))
                    verdict = apply_remeasure(verdict, self._judge(pending, outcome, again_s))
                    run_s, attempts = run_s + again_s, attempts + 1
                    verdict.run_s = round(run_s, 4)
                if needs_recheck(verdict, self.config):
                    outcome, again_s = slot.run(self._job(pending), refresh_reference=True)
                    verdict = apply_recheck(verdict, self._judge(pending, outcome, again_s), self.config)
                    verdict.run_s = round(run_s + again_s, 4)
                return verdict
            pending.rounds += 1
            if pending.rounds > MAX_BUILD_ROUNDS:
                return self._verdict(pending.item, Status.RUNTIME_ERROR, "load_inline was called with new sources on every run")
            spec = spec_check.spec_from_request(outcome.needs_build)
            if isinstance(spec, str):
                return self._verdict(pending.item, Status.FORBIDDEN, f"the runner asked to build something that is not "
                                     f"an extension spec ({spec}); the run counts for nothing", rule="protocol_violation")
            verdict = self.build_now(pending, spec)
            if verdict is not None:
                return verdict

    def _judge(self, pending: Pending, outcome, run_s: float) -> Verdict:
        cache_hit = all(b.cached for b in pending.builds.values())
        return verdict_from_run(pending.item.problem_id, outcome, self.config, isolation=self.isolation(),
                                compile_s=pending.compile_s, run_s=run_s, cache_hit=cache_hit)

    def _job(self, pending: Pending) -> RunJob:
        prebuilt = {d: [self._worker_path(b.so_path), b.module_name] for d, b in pending.builds.items()}
        return RunJob(pending.item.reference, pending.item.candidate, prebuilt)

    def _worker_path(self, so_path: Path) -> str:
        """Where the worker sees a built module (namespace sandboxes mount the cache read-only)."""
        if self.policy.mode == "namespace":
            return str(Path(SANDBOX_CACHE) / Path(so_path).resolve().relative_to(self.cache_dir.resolve()))
        return str(so_path)

    # ------------------------------------------------------------------ verdicts

    def _verdict(self, item: EvalItem, status: Status, reason: str, rule: str | None = None, feedback: str = "",
                 **kw: Any) -> Verdict:
        return make_verdict(item.problem_id, status, reason, self.config, self.isolation(), rule=rule,
                            feedback=feedback, **kw)

    def _internal_error(self, item: EvalItem, exc: BaseException) -> Verdict:
        return self._verdict(item, Status.CRASHED, f"evaluator error: {type(exc).__name__}: {exc}")


_open: weakref.WeakSet[Evaluator] = weakref.WeakSet()


def every_open_evaluator(method: str) -> None:
    """A Ctrl-C (``run/signals.py``): ``stop`` (in the signal handler), then ``close``, each evaluator not closed yet."""
    for evaluator in list(_open):
        getattr(evaluator, method)()


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


def _compile_workers(cfg: BenchConfig, cores: int) -> int:
    if cfg.compile_workers > 0:
        return cfg.compile_workers
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / (1 << 30)
    except (ValueError, OSError):
        mem_gb = 8.0
    return default_compile_workers(cfg.backend, cores, mem_gb)


def default_compile_workers(backend: str, cores: int, mem_gb: float) -> int:
    """Builds at a time (``evaluator.compile_workers=0``): on cuda half the compile cores, since a build runs
    nvcc's host and device front ends side by side (on a 16-core H100 box, 14 builds at a time took 17 s each
    and the first verdict of a batch came at 17 s; 8 at a time, 10 s each and 11 s, for the same throughput:
    docs/benchmarks.md); on cpu one per core; never more than memory holds (measured peak RSS of a build)."""
    per_build_gb = 3.0 if backend == "cuda" else 1.5
    wanted = cores // 2 if backend == "cuda" else cores
    return max(1, min(wanted, int(mem_gb // per_build_gb)))


class EvalSession:
    """Evaluations submitted one at a time, their verdicts delivered as they land: what ``Evaluator.evaluate``
    does for a batch, open for a rollout that submits each trajectory's turn as soon as it is generated. Static
    checks run in ``submit`` (on the caller's thread); builds go to the evaluator's compile pool; built
    candidates queue for the run slots, which this session serves until it is closed. Callbacks run on the
    submitting, compile or slot threads and must be quick (hand the verdict to a queue)."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self._run_queue: queue.Queue[Pending | object | None] = queue.Queue()  # object: WAKE
        self._callbacks: dict[int, Callable[[Verdict], None]] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._threads = [threading.Thread(target=evaluator._serve, args=(slot, self._run_queue, self._finish), daemon=True)
                         for slot in evaluator._slots]
        for t in self._threads:
            t.start()

    def submit(self, item: EvalItem, done: Callable[[Verdict], None]) -> None:
        with self._lock:
            index, self._next = self._next, self._next + 1
            self._callbacks[index] = done
        ev = self.evaluator
        try:
            verdict, pending, futures = ev._prepare(index, item)
        except Exception as exc:  # noqa: BLE001 - an evaluator bug still yields a verdict
            verdict, pending, futures = ev._internal_error(item, exc), None, []
        if verdict is not None:
            self._finish(index, verdict)
            return
        ev._when_built(pending, futures, self._run_queue, self._finish)
        if ev._references_ahead.add(item.reference):
            self._run_queue.put(WAKE)

    def _finish(self, index: int, verdict: Verdict) -> None:
        with self._lock:
            done = self._callbacks.pop(index)
        done(verdict)

    def close(self) -> None:
        """Stops the slot threads once every queued candidate has run (submitted items whose builds are still
        running get no verdict: close after the last one landed)."""
        for _ in self._threads:
            self._run_queue.put(None)
        for t in self._threads:
            t.join()

    def __enter__(self) -> "EvalSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def evaluate(items: Sequence[EvalItem], config: BenchConfig | None = None) -> list[Verdict]:
    """One-shot convenience wrapper around :class:`Evaluator`."""
    with Evaluator(config) as ev:
        return ev.evaluate(items)
