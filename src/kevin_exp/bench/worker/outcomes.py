"""How a job ends early inside the worker: ``Rejected`` is a verdict on the candidate (not an evaluator
error), ``NeedsBuild`` asks the parent to build a spec first; ``stage`` turns a stage's exception into a
``Rejected`` carrying the traceback's last lines."""
from __future__ import annotations

import traceback
from types import TracebackType

from kevin_exp.bench.spec import ExtensionSpec


class Rejected(Exception):
    """A candidate outcome that is a verdict, not an evaluator error."""

    def __init__(self, status: str, reason: str, rule: str | None = None, detail: str = "") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.rule = rule
        self.detail = detail


class NeedsBuild(Exception):
    """The candidate called load_inline with a spec the parent has not built yet."""

    def __init__(self, spec: ExtensionSpec) -> None:
        super().__init__(spec.name)
        self.spec = spec


def stage(status: str, prefix: str) -> _Stage:
    """``with stage("runtime_error", "your forward raised"):``: any exception from the block becomes a
    Rejected verdict with that status; Rejected and NeedsBuild pass through."""
    return _Stage(status, prefix)


class _Stage:
    def __init__(self, status: str, prefix: str) -> None:
        self.status, self.prefix = status, prefix

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or isinstance(exc, (Rejected, NeedsBuild)):
            return False
        if not isinstance(exc, Exception):
            return False
        detail = "".join(traceback.format_exception(exc_type, exc, tb)[-6:])
        raise Rejected(self.status, f"{self.prefix}: {type(exc).__name__}: {exc}"[:2000], detail=detail) from exc
