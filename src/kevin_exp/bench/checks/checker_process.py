"""The checker process behind ``deadline.run_checked``: reads ``(kind, args)`` requests from stdin, runs the
static checks and writes ``(status, value)`` replies to its original stdout (length-prefixed pickles).
Anything the checks print goes to stderr. It ends when stdin closes (its parent went away)."""
from __future__ import annotations

import os
import pickle
import resource
import struct
import sys
from typing import Any, Callable

from kevin_exp.bench.checks import candidate_violations
from kevin_exp.bench.checks.native import native_violations

KINDS: dict[str, Callable[..., Any]] = {"candidate": candidate_violations, "native": native_violations}
_HEADER = struct.Struct("<Q")
_MEMORY_LIMIT = 4 << 30  # address space: folding is bounded far below this; a runaway dies instead of swapping


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _reply(out: Any, status: str, value: Any) -> None:
    try:
        data = pickle.dumps((status, value), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an exception that does not pickle
        data = pickle.dumps(("raise", RuntimeError(f"{type(value).__name__}: {value}; {exc}")))
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def serve() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the replies
    sys.stdout = sys.stderr
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > _MEMORY_LIMIT:
            resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, hard))
    except (ValueError, OSError):
        pass
    out.write(b"R")
    out.flush()
    stdin = sys.stdin.fileno()
    while True:
        header = _read_exact(stdin, _HEADER.size)
        if header is None:
            return
        payload = _read_exact(stdin, _HEADER.unpack(header)[0])
        if payload is None:
            return
        kind, args = pickle.loads(payload)
        try:
            value = KINDS[kind](*args)
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller, as if the check ran there
            _reply(out, "raise", exc)
        else:
            _reply(out, "ok", value)


if __name__ == "__main__":
    serve()
