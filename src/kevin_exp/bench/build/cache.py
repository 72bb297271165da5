"""Content-addressed cache layout, per-key file locks and atomic publication of finished entries.

Layout under ``cache_dir``::

    ext/<key[:2]>/<key>/{<module>.so, meta.json, build.log, sources}   finished extensions
    ext/<key[:2]>/<key>.lock                                          flock held while building
    ext/<key[:2]>/.tmp-<key>-<pid>-<rand>/                             a build in progress
    pch/<pch-key>/torch/extension.h.gch                               precompiled lean headers
    reg/<reg-key>/reg.o                                               cached pybind11 binding objects
    lean/<torch-key>/kx_ops/*.h                                       generated lean op headers

A build's ``.tmp-*`` folder is published or removed by the build itself; a stale one of a crashed build is removed
by the next build of its key. A Ctrl-C removes this process's own at once (``remove_own_tmp_dirs``).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import threading
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
    with _own_lock:
        if _stopped:
            raise OSError(f"{final.parent}: no build starts, the run is stopping (Ctrl-C)")
        if len(_own_tmp) > 64:  # the ones the builds removed themselves
            _own_tmp.difference_update([p for p in _own_tmp if not p.exists()])
        tmp.mkdir()
        _own_tmp.add(tmp)
    return tmp


def publish(tmp: Path, final: Path) -> None:
    """Atomically turn a finished tmp dir into the entry (rename is atomic within one filesystem)."""
    with _own_lock:  # never beside remove_own_tmp_dirs: an entry is published whole or not at all
        if _stopped and tmp not in _own_tmp:
            raise OSError(f"{tmp}: removed, the run is stopping (Ctrl-C)")
        _own_tmp.discard(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if final.exists():  # someone published it meanwhile (lock-less callers): keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                raise


# this process's build folders in progress (new_tmp_dir until publish), and whether a Ctrl-C stopped building
_own_tmp: set[Path] = set()
_own_lock = threading.Lock()
_stopped = False


def remove_own_tmp_dirs() -> list[Path]:
    """A Ctrl-C (``run/signals.py``): this process's unfinished build folders are removed, and none is made after
    it. The ones removed."""
    global _stopped
    with _own_lock:
        _stopped = True
        removed = [p for p in _own_tmp if p.exists()]
        for tmp in removed:
            shutil.rmtree(tmp, ignore_errors=True)
        _own_tmp.clear()
    return removed


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
