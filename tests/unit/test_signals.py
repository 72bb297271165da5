"""A preemption signal that lands while a checkpoint is written is delivered once the write is done."""
from __future__ import annotations

import os
import signal

from kevin_exp.run.signals import signals_held


def test_a_signal_during_the_held_section_reaches_the_handler_after_it():
    events = []
    old = signal.signal(signal.SIGUSR2, lambda signum, frame: events.append(("handler", signum)))
    try:
        with signals_held():
            os.kill(os.getpid(), signal.SIGUSR2)
            events.append(("checkpoint written",))
        assert events == [("checkpoint written",), ("handler", signal.SIGUSR2)]
        os.kill(os.getpid(), signal.SIGUSR2)  # outside the section: the handler again, at once
        assert events[-1] == ("handler", signal.SIGUSR2) and len(events) == 3
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_a_held_section_without_a_signal_changes_nothing():
    handler = lambda signum, frame: None  # noqa: E731
    old = signal.signal(signal.SIGUSR2, handler)
    try:
        with signals_held():
            pass
        assert signal.getsignal(signal.SIGUSR2) is handler
    finally:
        signal.signal(signal.SIGUSR2, old)
