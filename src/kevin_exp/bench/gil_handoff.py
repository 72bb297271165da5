"""A run's lockstep driver is a thread of the evaluator's process, and so is whatever else that process does:
under the ``pipeline`` and ``halves`` schedules, the policy generating the next turns. Python hands the GIL to a
thread whose reply has arrived only after the thread holding it has run for ``sys.getswitchinterval()`` (5 ms by
default), and a run waits on some 500 replies. While a run is in progress the interval is 0.2 ms (then put
back): a busy Python thread beside the run then delays each reply by at most that."""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

RUN_SWITCH_INTERVAL_S = 0.0002

_lock = threading.Lock()
_runs = 0
_saved = 0.0


@contextlib.contextmanager
def prompt_handoff() -> Iterator[None]:
    """The switch interval at most ``RUN_SWITCH_INTERVAL_S`` while at least one run is in progress."""
    global _runs, _saved
    with _lock:
        if _runs == 0:
            _saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved, RUN_SWITCH_INTERVAL_S))
        _runs += 1
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0:
                sys.setswitchinterval(_saved)
