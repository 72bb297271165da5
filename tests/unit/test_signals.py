"""A preemption signal, or a user's Ctrl-C, that lands while a checkpoint is written is delivered once the write is
done."""
from __future__ import annotations

import os
import signal

import pytest

from kevin_exp.run import signals
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


def test_a_ctrl_c_while_a_checkpoint_is_written_stops_the_run_once_it_is_written_and_a_second_is_ignored(monkeypatch):
    monkeypatch.setattr(signals, "_ctrl_c", signals._CtrlC())
    monkeypatch.setattr(signals, "_STOP", ())  # nothing of this test process's evaluators is stopped
    old = signal.signal(signal.SIGINT, signals._on_ctrl_c)
    events = []
    try:
        with pytest.raises(signals.Interrupted):
            with signals_held():
                os.kill(os.getpid(), signal.SIGINT)
                events.append("checkpoint written")
        assert events == ["checkpoint written"] and signals.stopping()
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while the run stops: nothing is raised
        assert signals._ctrl_c.presses == 2
    finally:
        signal.signal(signal.SIGINT, old)
