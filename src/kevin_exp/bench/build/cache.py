"""Content-addressed cache layout, per-key file locks and atomic publication of finished entries.

Layout under ``cache_dir``::

    ext/<key[:2]>/<key>/{<module>.so, meta.json, build.log, sources}   finished extensions
    ext/<key[:2]>/<key>.lock                                          flock held while building
    ext/<key[:2]>/.tmp-<key>-<pid>-<rand>/                             a build in progress
    pch/<pch-key>/torch/extension.h.gch                               precompiled lean headers
    reg/<reg-key>/reg.o                                               cached pybind11 binding objects
    lean/<torch-key>/kx_ops/*.h                                       generated lean op headers
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator


def digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def entry_dir(root: Path, kind: str, key: str) -> Path:
    return root / kind / key[:2] / key if kind == "ext" else root / kind / key


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive flock on ``path`` (created if missing); released on exit, also on a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def try_locked(path: Path) -> Iterator[bool]:
    """Like `locked` but never waits: yields False when another holder has the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def lock_path(final: Path) -> Path:
    return final.parent / f"{final.name}.lock"


def new_tmp_dir(final: Path) -> Path:
    """A private build dir next to ``final``; stale ones of crashed builds are removed first.

    Call with the key's lock held: any other tmp dir of this key then belongs to a dead build.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def publish(tmp: Path, final: Path) -> None:
    """Atomically turn a finished tmp dir into the entry (rename is atomic within one filesystem)."""
    try:
        os.rename(tmp, final)
    except OSError:
        if final.exists():  # someone published it meanwhile (lock-less callers): keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))


def bump_counter(path: Path) -> int:
    """Append one byte and return how many were appended so far (a cheap cross-process counter)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, b".")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)
