"""Keep SLURM's time-limit/preemption signal from cutting a checkpoint in half.

Under submitit, SIGUSR2 (sent ``hydra.launcher.signal_delay_s`` before the time limit, or on preemption)
requeues the job and exits at once; the requeued job resumes from the run directory's last checkpoint.
A signal that lands while a checkpoint is being written is held until the write is done, so a finished
step is never thrown away.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HELD = (signal.SIGUSR2, signal.SIGTERM)


@contextlib.contextmanager
def signals_held(signums: tuple[signal.Signals, ...] = HELD) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be swapped on the main thread; elsewhere nothing is held
        return
    pending: list[tuple[int, FrameType | None]] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append((signum, frame))) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum, frame in pending:
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
