"""The signals a run answers: SLURM's time-limit/preemption signal, and a user's Ctrl-C.

Under submitit, SIGUSR2 (sent ``hydra.launcher.signal_delay_s`` before the time limit, or on preemption)
requeues the job and exits at once; the requeued job resumes from the run directory's last checkpoint.
A signal that lands while a checkpoint is being written is held until the write is done, so a finished
step is never thrown away.

Ctrl-C (SIGINT; a terminal sends it to its whole foreground process group, but the evaluator's children run in
groups or sessions of their own, so this process alone gets it). The first one stops the evaluator's work at once
(compilers' process groups, runners and reference processes killed; no compile or run starts after it) and raises
``Interrupted`` in the main thread, which unwinds through the loops' ``finally`` blocks (records flushed and closed,
evaluator closed). ``exits_on_ctrl_c``, around each entry point, then closes what the unwinding did not reach,
removes this process's temporary build folders, prints what the job registered with ``say_on_ctrl_c`` (where its
records and last checkpoint are, the command that resumes it) and exits with 130. A second Ctrl-C meanwhile is
ignored (one line says so) so the cleanup is never cut short, and a watchdog ends the process if its exit still
hangs. A Ctrl-C while a checkpoint is being written takes effect once the write is done.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

from kevin_exp.errors import EXIT_INTERRUPTED

HELD = (signal.SIGUSR2, signal.SIGTERM)
# after a Ctrl-C: the longest the killed compiles are waited for before the temporary build folders are removed,
# and the longest the interpreter's exit may take after the message (threads it joins) before it is cut short
COMPILES_END_S = 5.0
EXIT_GRACE_S = 20.0

# (module, function, arguments) of the evaluator's parts this process loaded, called by name so that stopping imports
# nothing. The first take no lock and wait for nothing (they run in the signal handler); the others run after the
# unwinding.
_STOP = (("kevin_exp.bench.build.proc", "stop_compiles"), ("kevin_exp.bench.evaluator", "every_open_evaluator", "stop"))
_CLEAN_UP = (("kevin_exp.bench.evaluator", "every_open_evaluator", "close"),
             ("kevin_exp.bench.build.proc", "wait_for_compiles", COMPILES_END_S),
             ("kevin_exp.bench.build.cache", "remove_own_tmp_dirs"))


@contextlib.contextmanager
def signals_held(signums: tuple[signal.Signals, ...] = HELD) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be swapped on the main thread; elsewhere nothing is held
        return
    pending: list[tuple[int, FrameType | None]] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append((signum, frame))) for s in signums}
    _ctrl_c.holding = True
    try:
        yield
    finally:
        _ctrl_c.holding = False
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum, frame in pending:
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
    if _ctrl_c.deferred:  # a Ctrl-C came while the checkpoint was written: it stops the run now
        _ctrl_c.deferred = False
        raise Interrupted


class Interrupted(KeyboardInterrupt):
    """The user's first Ctrl-C, raised in the main thread wherever it was."""


@dataclass
class _CtrlC:
    presses: int = 0
    # a checkpoint is being written (signals_held): the first Ctrl-C waits for it (deferred)
    holding: bool = False
    deferred: bool = False
    # what the running job says when it is stopped (say_on_ctrl_c)
    report: Callable[[], list[str]] | None = None


_ctrl_c = _CtrlC()


def _say(text: str) -> None:
    """A line on stderr from the signal handler: straight to the descriptor (the interrupted code may be inside a
    write to sys.stderr, which a second write would find re-entered)."""
    with contextlib.suppress(OSError):
        os.write(2, f"\n{text}\n".encode())


def _call(steps: tuple[tuple, ...]) -> None:
    for module, name, *args in steps:
        loaded = sys.modules.get(module)
        if loaded is not None:
            with contextlib.suppress(Exception):
                getattr(loaded, name)(*args)


def _on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    _ctrl_c.presses += 1
    if _ctrl_c.presses > 1:
        if _ctrl_c.presses == 2:
            _say("still stopping: closing the compilers and runners and the records (a few seconds); "
                 "further Ctrl-C are ignored")
        return
    _call(_STOP)
    if _ctrl_c.holding:
        _ctrl_c.deferred = True
        _say("Ctrl-C: stopping once the checkpoint being written is complete")
        return
    raise Interrupted


def stopping() -> bool:
    """Whether the user pressed Ctrl-C: the evaluator's verdicts since then are not the candidates' own."""
    return _ctrl_c.presses > 0


def raise_if_stopping() -> None:
    """Before records are written: nothing scored after a Ctrl-C is recorded (the evaluator stopped under it)."""
    if stopping():
        raise Interrupted


def say_on_ctrl_c(report: Callable[[], list[str]]) -> None:
    """What the running job prints when a Ctrl-C stops it (called after the cleanup; a job of a sweep replaces
    the one before it). The lines should say where its records and last checkpoint are and how to resume."""
    _ctrl_c.report = report


@contextlib.contextmanager
def exits_on_ctrl_c() -> Iterator[None]:
    """Around an entry point: Ctrl-C stops it cleanly (module doc), says what the job registered, exits 130."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)  # (a SIGINT ignored, as in a job started with `&`, stays ignored)
    try:
        yield
    except KeyboardInterrupt:
        _ctrl_c.presses = max(_ctrl_c.presses, 1)  # a default handler's KeyboardInterrupt counts as the first one
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _on_ctrl_c)
        _call(_STOP)
        _call(_CLEAN_UP)
        lines = _report_lines()
        if lines:
            print("\n".join(lines), file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        _end_after(EXIT_GRACE_S)
        raise SystemExit(EXIT_INTERRUPTED) from None


def _report_lines() -> list[str]:
    if _ctrl_c.report is None:
        return ["interrupted (Ctrl-C) before any run started: nothing was written"]
    try:
        return _ctrl_c.report()
    except Exception as e:  # noqa: BLE001 - the stop itself went well; only its description failed
        return [f"interrupted (Ctrl-C); where its records are could not be told ({type(e).__name__}: {e})"]


def _end_after(seconds: float) -> None:
    """The process ends within ``seconds`` even if a thread the interpreter joins at exit never returns (its
    children are gone already)."""
    def end() -> None:
        time.sleep(seconds)
        os._exit(EXIT_INTERRUPTED)

    threading.Thread(target=end, daemon=True, name="kx-exit").start()
