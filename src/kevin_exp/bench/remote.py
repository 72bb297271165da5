"""Evaluation on other SLURM nodes (``evaluator.placement=remote``), through dask-jobqueue.

``RemoteEvaluator`` has the local evaluator's surface (``evaluate``, ``session``, ``config``, ``close``), so the
training run sees the same verdict objects. It starts a dask scheduler in the training process and
``RemoteSettings.workers`` SLURM jobs through dask-jobqueue's ``SLURMCluster``, each one dask worker process that
holds one node-level ``Evaluator`` (sandboxed workers, compile pool, run slots on its own GPUs) behind one
``EvalSession``; a candidate is a dask task that waits for its verdict there, so a worker takes up to
``in_flight`` candidates at once and its evaluator schedules them as it does locally.

A worker that dies (its job killed, preempted, out of time) loses nothing: dask reschedules the tasks it held
onto the other workers, and the cluster's adaptive minimum starts a job to replace it. Each candidate's verdict
reaches its callback once (a dask future completes once). Why dask-jobqueue and not Ray, or a queue of files on a
shared folder: docs/remote-evaluation.md.
"""
from __future__ import annotations

import os
import shlex
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.eval_items import EvalItem, evaluate_in_session
from kevin_exp.bench.evaluator import Evaluator
from kevin_exp.bench.verdict import Status, Verdict, make_verdict


@dataclass(frozen=True)
class RemoteSettings:
    workers: int = 1
    cores: int = 16
    memory_gb: float = 64.0
    gpus: int = 1
    partition: str | None = None
    account: str | None = None
    walltime_min: int = 240
    interface: str | None = None
    log_dir: str | None = None
    job_extra: tuple[str, ...] = ()
    in_flight: int = 64
    start_timeout_s: float = 600.0


class RemoteEvaluator:
    def __init__(self, config: BenchConfig, remote: RemoteSettings) -> None:
        from dask_jobqueue import SLURMCluster
        from distributed import Client

        self.config, self.remote = config, remote
        log_dir = Path(remote.log_dir or "evaluator-workers").resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        extra = [*remote.job_extra, *([f"--gres=gpu:{remote.gpus}"] if remote.gpus else [])]
        hours, minutes = divmod(remote.walltime_min, 60)
        self.cluster = SLURMCluster(
            cores=remote.cores, processes=1, memory=f"{remote.memory_gb:g}GB", queue=remote.partition,
            account=remote.account, walltime=f"{hours:02d}:{minutes:02d}:00", job_extra_directives=extra,
            log_directory=str(log_dir), interface=remote.interface,
            python=shlex.quote(sys.executable),  # a line of the job's shell script, as the prologue below
            job_name="kx-evaluator",
            # the worker's thread count is the candidates it holds at once, each waiting for its verdict
            worker_extra_args=["--nthreads", str(remote.in_flight)],
            # the workers' environment: this checkout's code, no CUDA device hidden by the trainer's launcher
            job_script_prologue=[f"export PYTHONPATH={shlex.quote(_pythonpath())}"],
            scheduler_options={"dashboard_address": None},
        )
        # a job that ends is replaced: never fewer than `workers` jobs while the run lasts
        self.cluster.adapt(minimum_jobs=remote.workers, maximum_jobs=remote.workers)
        self.client = Client(self.cluster)
        try:
            self.client.wait_for_workers(1, timeout=remote.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 - dask raises its own TimeoutError
            self.close()
            raise RuntimeError(f"no remote evaluator worker started within evaluator.remote.start_timeout_s="
                               f"{remote.start_timeout_s:g} s; their SLURM logs are in {log_dir}") from exc
        self.delivered = 0

    def session(self) -> "RemoteSession":
        return RemoteSession(self)

    def evaluate(self, items: Sequence[EvalItem], on_verdict: Callable[[Verdict], None] | None = None) -> list[Verdict]:
        return evaluate_in_session(self.session(), items, on_verdict, self.lost)

    def lost(self, item: EvalItem, exc: BaseException) -> Verdict:
        """The verdict of a candidate whose evaluation failed for good (dask gave up on it)."""
        return make_verdict(item.problem_id, Status.CRASHED, f"remote evaluation failed: {type(exc).__name__}: {exc}",
                            self.config, "remote")

    def worker_jobs(self) -> list[str]:
        """The SLURM job ids of the workers running now."""
        return [job.job_id for job in self.cluster.workers.values() if getattr(job, "job_id", None)]

    def close(self) -> None:
        for closer in (getattr(self, "client", None), getattr(self, "cluster", None)):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - closing what may already be gone
                    pass

    def __enter__(self) -> "RemoteEvaluator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemoteSession:
    """Candidates sent to the workers as they come; each verdict handed to its callback once."""

    def __init__(self, evaluator: RemoteEvaluator) -> None:
        self.evaluator = evaluator
        self._futures: set[Any] = set()
        self._lock = threading.Lock()

    def submit(self, item: EvalItem, done: Callable[[Verdict], None]) -> None:
        ev = self.evaluator
        # pure=False: a candidate submitted twice is evaluated twice, as locally; retries: a task whose worker
        # died is rescheduled by dask itself (that is not a retry); these cover an exception in the task
        future = ev.client.submit(evaluate_on_worker, ev.config, item, pure=False, retries=2)

        def landed(f: Any) -> None:
            with self._lock:
                self._futures.discard(f)
            try:
                verdict = f.result()
            except Exception as exc:  # noqa: BLE001 - a task that failed for good still gets a verdict
                verdict = ev.lost(item, exc)
            ev.delivered += 1
            done(verdict)

        with self._lock:
            self._futures.add(future)
        future.add_done_callback(landed)

    def close(self) -> None:
        with self._lock:
            pending = list(self._futures)
        for f in pending:
            f.cancel()




# ---------------------------------------------------------------------- on the worker
_WORKER: dict[str, Any] = {}
_WORKER_LOCK = threading.Lock()


def evaluate_on_worker(config: BenchConfig, item: EvalItem) -> Verdict:
    """Runs in a dask worker: the worker's one evaluator session (made on the first candidate) takes the item;
    this task's thread waits for its verdict."""
    with _WORKER_LOCK:
        session = _WORKER.get("session")
        if session is None:
            evaluator = Evaluator(config)
            session = _WORKER["session"] = evaluator.session()
    landed = threading.Event()
    box: list[Verdict] = []

    def done(verdict: Verdict) -> None:
        box.append(verdict)
        landed.set()

    session.submit(item, done)
    landed.wait()
    return box[0]


def _pythonpath() -> str:
    src = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])
