"""The one kind of user error, and the one place that turns it into a message and an exit status.

A ``UserError`` is a mistake the user can fix (a bad setting, a missing folder, an unreachable cluster): its
message names the setting or argument, the bad value, and what is allowed or what to do. Every entry point
(``kevin_exp.train``, ``kevin_exp.evaluate``, ``kevin_exp.bench``, ``kevin_exp.show``, the analysis scripts, the
cluster launcher) runs under ``user_errors()``: the message is printed as one line on stderr and the process
exits with ``EXIT_USER_ERROR``. Any other exception is a bug and keeps its traceback. A user's Ctrl-C is neither:
the run stops, cleans up and exits with ``EXIT_INTERRUPTED`` (``run/signals.py``).
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator, TypeVar

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # what a shell reports for a process that SIGINT ended (128 + 2)

F = TypeVar("F", bound=Callable[..., Any])


class UserError(Exception):
    """A mistake the user can fix; the message names what is wrong and the fix."""


class LaunchError(UserError):
    """A launch that cannot go as asked: its ranks (``launch/ranks.py``) or its cluster (``launch/slurm_checks.py``)."""


def one_line(message: str) -> str:
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def report(error: UserError) -> None:
    print(f"error: {one_line(str(error))}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turns a ``UserError`` raised inside into its message and exit status 2 (SystemExit passes through Hydra)."""
    try:
        yield
    except UserError as e:
        report(e)
        raise SystemExit(EXIT_USER_ERROR) from None


def exits_on_user_error(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_errors():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
