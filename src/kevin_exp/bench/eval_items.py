"""What the evaluator's stages hand one another: the item submitted (``EvalItem``), a candidate waiting for its
builds or for a run slot (``Pending``), the token that wakes an idle slot (``WAKE``) and the references it may
time ahead (``ReferencesAhead``); and a batch of items through a session, local or remote, its verdicts in the
items' order (``evaluate_in_session``)."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from kevin_exp.bench.build.builder import BuildResult
from kevin_exp.bench.spec import ExtensionSpec
from kevin_exp.bench.verdict import Verdict


@dataclass(frozen=True)
class EvalItem:
    problem_id: str
    reference: str
    candidate: str


@dataclass
class Pending:
    index: int
    item: EvalItem
    specs: list[ExtensionSpec]
    builds: dict[str, BuildResult]
    compile_s: float = 0.0
    rounds: int = 0


WAKE = object()  # put on a run queue to make an idle slot look for references to time ahead


class ReferencesAhead:
    """Reference programs of submitted candidates, for an idle run slot to time before their first run (each once
    per evaluator; the timings cache on disk keeps them after)."""

    def __init__(self) -> None:
        self._todo: deque[str] = deque()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def add(self, source: str) -> bool:
        with self._lock:
            if source in self._seen:
                return False
            self._seen.add(source)
            self._todo.append(source)
            return True

    def take(self) -> str | None:
        with self._lock:
            return self._todo.popleft() if self._todo else None


def evaluate_in_session(session: Any, items: Sequence[EvalItem], on_verdict: Callable[[Verdict], None] | None,
                        missing: Callable[[EvalItem, BaseException], Verdict]) -> list[Verdict]:
    """A batch through a session (local or remote): every item submitted, the verdicts in the items' order once
    all have landed (``on_verdict`` sees each as it lands); the session is closed after."""
    results: list[Verdict | None] = [None] * len(items)
    remaining = threading.Semaphore(0)

    def landed(index: int, verdict: Verdict) -> None:
        results[index] = verdict
        if on_verdict is not None:
            on_verdict(verdict)
        remaining.release()

    try:
        for index, item in enumerate(items):
            session.submit(item, lambda verdict, index=index: landed(index, verdict))
        for _ in items:
            remaining.acquire()
    finally:
        session.close()
    return [v if v is not None else missing(items[i], RuntimeError("no verdict")) for i, v in enumerate(results)]
