"""Run slots: the serial stage. A slot owns one device (or a CPU share) and runs one candidate at a time:
its warm trusted reference process, and a fresh sandboxed runner per candidate, taken from standby runners
that keep starting so a runner's cold start (sandbox, torch, CUDA, the op guard) is not paid per candidate.
Each runner has its own memfd (``exchange``) for tensors, sealed at its size before its candidate loads and handed
to the reference process for its run; the parent drives the two in lockstep (``protocol``). Whatever a run ends
in, the next one finds the slot as it would have without it: the runner killed, the reference process in step
(restarted when it is not)."""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Iterator

from kevin_exp.bench.config import BenchConfig
from kevin_exp.bench.cpu_split import CpuSplit, pin_thread
from kevin_exp.bench.device_gate import DeviceGate
from kevin_exp.bench.exchange import ALIGN, new_exchange_fd
from kevin_exp.bench.fork_client import ForkServer
from kevin_exp.bench.gil_handoff import prompt_handoff
from kevin_exp.bench.protocol import RunJob, run_protocol, time_reference_ahead
from kevin_exp.bench.reference_process import START_TIMEOUT_S, ReferenceProcess, ReferenceTimings
from kevin_exp.bench.run_outcome import RunOutcome
from kevin_exp.bench.sandbox import SandboxPolicy
from kevin_exp.bench.worker_process import WorkerProcess

REAP_WAIT_S = 15.0  # the longest the reference's timing waits for a retired runner to be gone


class RunSlot:
    def __init__(self, index: int, device: str | None, n_standby: int, *, policy: SandboxPolicy,
                 config: BenchConfig, run_root: Path, cache_dir: Path, threads: int,
                 fork_server: ForkServer | None = None, cpus: frozenset[int] = frozenset(),
                 standby_cpus: frozenset[int] = frozenset()) -> None:
        """``cpus``: the slot's own cores (``cpu_split``; empty: none reserved): the slot's thread and the runner
        join them for the run, so nothing else runs there while a call is timed (the timed region ends on the
        host, after a device-wide synchronise). Standby runners start on ``standby_cpus`` (the compile cores), and so
        does the reference process run on cuda, where it checks a timed call while the runner makes the next; on
        cpu it runs on the slot's cores, where it is timed as the candidate is."""
        self.index, self.device, self.n_standby, self.fork_server = index, device, n_standby, fork_server
        self.cpus, self.standby_cpus = cpus, standby_cpus
        self.policy, self.config, self.run_root, self.cache_dir, self.threads = (
            policy, config, run_root, cache_dir, threads)
        # a new runner's exchange starts at the largest size a run has sealed (it is mapped, and on cuda
        # page-locked, while the runner starts, not during its run)
        self.exchange_size = ALIGN
        self.timings = ReferenceTimings(cache_dir)
        self._reference: ReferenceProcess | None = None
        self._standby: deque[WorkerProcess] = deque()
        self._reapers: list[threading.Thread] = []
        # reapers of runners killed mid-call (a hang, a crash): the next run waits for them (_wait_for_the_killed)
        self._killed: list[threading.Thread] = []
        # the runner of the run under way; after stop() no runner or reference process starts
        self._running: WorkerProcess | None = None
        self.stopped = False
        self.gate = DeviceGate(run_root / f"device-gate-{index}") if config.backend == "cuda" else None

    def start(self) -> None:
        """Start the reference process and the standby runners (a batch does this first, so they start while
        its first compiles run). A slot stopped (a Ctrl-C), even while it starts, raises nothing here: its runs fail."""
        try:
            self.reference()
            self._top_up()
        except Exception:
            if not self.stopped:
                raise

    def reference(self) -> ReferenceProcess:
        """The slot's reference process, restarted if it has died."""
        if self.stopped:
            raise RuntimeError("the evaluation was stopped (Ctrl-C)")
        if self._reference is not None and not self._reference.alive():
            self._reference.close()
            self._reference = None
        if self._reference is None:
            self._reference = ReferenceProcess(self.config.backend, self.device, self.threads,
                                               self.config.max_output_bytes)
            # on cpu the reference is timed on the cores the candidate is timed on
            self._reference.pin(self.cpus if self.config.backend == "cpu" else self.standby_cpus)
        return self._reference

    def run(self, job: RunJob, seed: int | None = None, refresh_reference: bool = False) -> tuple[RunOutcome, float]:
        """Run one candidate in a fresh runner: its outcome, and the seconds the run took. ``refresh_reference``
        times the reference again first (a recheck does)."""
        t_take = time.monotonic()
        waited = self._wait_for_the_killed()
        ref = self.reference()
        worker = self._running = self._take()
        if self.config.backend == "cuda":
            self._top_up()  # the next ones start while this one runs (on CPU they would take the timed run's cores)
        t0 = time.monotonic()
        try:
            with self._on_own_cores(worker), prompt_handoff():
                outcome = run_protocol(ref, worker, worker.exchange_fd, self.timings, job, self.config, seed,
                                       quiet=self._quiet, refresh_reference=refresh_reference,
                                       device_quiet=self.gate.quiet if self.gate is not None else contextlib.nullcontext)
        except Exception as exc:  # noqa: BLE001 - an evaluator bug ends this candidate's run, not the slot
            outcome = RunOutcome(status="crashed", phase="run",
                                 reason=f"evaluator error during the run: {type(exc).__name__}: {exc}"[:2000])
            ref.pending = max(ref.pending, 1)  # where it stopped is unknown: the reference is restarted
        run_s = time.monotonic() - t0
        outcome.cores = sorted(self.cpus)
        t1 = time.monotonic()
        self.exchange_size = max(self.exchange_size, _size_of(worker.exchange_fd))  # (sealed before candidate code)
        self._retire(worker, killed=outcome.ended is not None or outcome.status in ("timeout", "crashed"))
        self._running = None
        if waited:
            outcome.phases["killed_runner_wait_s"] = round(waited, 4)
        if not ref.alive() or ref.pending:
            self._drop_reference()  # a reply behind (or gone): the next run starts a fresh one
            outcome.phases["reference_restarted"] = 1.0
        self._top_up()
        # the slot's own time around the run (taking a runner, starting the next ones): diagnostics only
        outcome.phases.update(slot_take_s=round(t0 - t_take, 4), slot_after_s=round(time.monotonic() - t1, 4))
        return outcome, run_s

    def time_reference(self, source: str) -> None:
        """The reference's timing measured now, while the slot has nothing to run, for its problem's first run to
        find in the cache."""
        time_reference_ahead(self.reference(), self.timings, source, self.config, quiet=self._quiet)

    @contextlib.contextmanager
    def _on_own_cores(self, worker: WorkerProcess) -> Iterator[None]:
        """The run on the slot's cores: this thread (back where it was after, so runners it starts later start
        elsewhere) and the runner (every thread of it)."""
        if not self.cpus:
            yield
            return
        before = os.sched_getaffinity(0)
        pin_thread(self.cpus)
        worker.pin(self.cpus)
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)

    def _quiet(self) -> None:
        """Before the reference is timed: let the standby runners finish starting (they would take its cores), and
        the retired ones finish ending: a runner killed at its limit frees its memory as it exits and, on cuda, keeps
        the device busy with whatever kernel it left running until its context is torn down, and the reference
        timed meanwhile (ahead, for a problem's first run) would be measured beside it."""
        for worker in list(self._standby):
            worker.wait_ready(START_TIMEOUT_S)
        for reaper in list(self._reapers):
            reaper.join(timeout=REAP_WAIT_S)

    def _drop_reference(self) -> None:
        if self._reference is not None:
            self._reference.close()
            self._reference = None

    def stop(self) -> None:
        """A Ctrl-C (``Evaluator.stop``): the runners and the reference process are killed, the run under way ends at
        once, and none starts after it. No lock, no wait: it runs in the signal handler; ``close`` reaps them."""
        self.stopped = True
        for child in [*self._standby, self._running, self._reference]:
            if child is not None:
                child._kill_group()

    def close(self) -> None:
        while self._standby:
            self._standby.popleft().close()
        if self._reference is not None:
            self._reference.close()
            self._reference = None
        for reaper in self._reapers:
            reaper.join(timeout=REAP_WAIT_S)
        self._reapers.clear()
        if self.gate is not None:
            self.gate.close()

    def _take(self) -> WorkerProcess:
        while self._standby:
            worker = self._standby.popleft()
            if worker.alive():
                return worker
            worker.close()
        return self._spawn()

    def _top_up(self) -> None:
        """Refill the standby runners once half of them are used, all at once: on cuda each start holds the device
        gate shared while CUDA starts, and a run waits for starts under way; started together, several cost a run
        one such wait, where one started after every run cost every run one."""
        if len(self._standby) > self.n_standby // 2 or self.stopped:
            return
        while len(self._standby) < self.n_standby:
            self._standby.append(self._spawn())

    def _spawn(self) -> WorkerProcess:
        if self.stopped:
            raise RuntimeError("the evaluation was stopped (Ctrl-C)")
        worker = self._start_worker()
        if self.stopped:  # stopped while it started (close reaps it)
            worker._kill_group()
        if self.cpus and not worker.forked:  # (forked ones start where the fork server runs: the compile cores)
            worker.pin(self.standby_cpus)
        return worker

    def _start_worker(self) -> WorkerProcess:
        cfg = self.config
        return WorkerProcess(
            self.policy,
            cfg.backend,
            self.index,
            self.run_root,
            new_exchange_fd(self.exchange_size),
            cuda_device=self.device,
            cache_dir=self.cache_dir,
            memory_limit_gb=cfg.memory_limit_gb,
            threads=self.threads,
            max_output_bytes=cfg.max_output_bytes,
            forbid_new_tasks=cfg.forbid_new_tasks,
            device_gate_fd=self.gate.runner_fd() if self.gate is not None else -1,
            fork_server=self.fork_server,
        )

    def _retire(self, worker: WorkerProcess, killed: bool = False) -> None:
        """The runner has finished (or died): kill it and reap it off the critical path; one ended mid-call
        (``killed``) is waited for before the next run (``_wait_for_the_killed``)."""
        reaper = worker.close(wait=False)
        self._reapers = [r for r in self._reapers if r.is_alive()]
        if reaper is not None:
            self._reapers.append(reaper)
            if killed:
                self._killed.append(reaper)

    def _wait_for_the_killed(self) -> float:
        """Before a run: the runners killed mid-call have finished ending. On cuda a killed runner's context, and a
        kernel it left running on every SM, last until the driver tears them down; a run beside that is slowed
        (its outside clock, its copies), so what one candidate left running would change the next one's verdict.
        The seconds waited."""
        t0 = time.monotonic()
        for reaper in self._killed:
            reaper.join(timeout=REAP_WAIT_S)
        self._killed.clear()
        waited = time.monotonic() - t0
        return waited if waited > 1e-3 else 0.0


def _size_of(fd: int) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:  # already closed by its reaper
        return 0


def slot_devices(cfg: BenchConfig) -> list[str | None]:
    """One entry per run slot: the CUDA device it owns, or None for a CPU slot."""
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


def usable_cores(cpus: int) -> int:
    """The cores the evaluator sizes itself by: its configured share, or the whole machine."""
    return cpus or os.cpu_count() or 1


def default_standby(backend: str, n_slots: int, cores: int) -> int:
    """Workers starting ahead per run slot. A GPU run takes ~1 s and a cold worker ~10 s, so one slot
    needs several starting at once to stay busy; half the cores, shared by the slots, keeps the rest for
    compiles."""
    if backend != "cuda":
        return 1
    return max(2, min(8, cores // (2 * max(1, n_slots))))


def worker_threads(backend: str, n_slots: int, cores: int, split: CpuSplit | None = None) -> int:
    """Torch threads per worker: on cpu the slot's own cores where it has some, else the cores shared by the
    slots; 0 (torch's default) on cuda."""
    if backend != "cpu":
        return 0
    if split is not None and split.active:
        return len(split.slot(0))
    return max(1, cores // n_slots)
