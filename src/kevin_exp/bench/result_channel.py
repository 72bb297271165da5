"""The worker's result channel, authenticated.

Native candidate code runs inside the worker and can write to any of its descriptors, the result pipe
included. Each job therefore carries a fresh random key (sent on stdin, never written to disk) and the
worker signs its result with it (HMAC-SHA256); the parent rejects anything else that came down the pipe as
a forged result.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

RESULT_KEY_BYTES = 32
_MAC_HEX = 64


def read_key(fd: int) -> bytearray:
    """The job's key, read from ``fd`` straight into a bytearray (no buffered copy), so it can be wiped."""
    key = bytearray(RESULT_KEY_BYTES)
    got = 0
    while got < len(key):
        n = os.readv(fd, [memoryview(key)[got:]])
        if n == 0:
            raise SystemExit("worker: stdin closed before the job arrived")
        got += n
    return key


def sign_result(key: bytes | bytearray, payload: bytes) -> bytes:
    return hmac.new(bytes(key), payload, hashlib.sha256).hexdigest().encode() + payload


def read_signed_result(key: bytes, data: bytes) -> tuple[dict[str, Any] | None, bool]:
    """(result, forged) from what came down the result pipe.

    A correctly signed message is the result. Unsigned messages are accepted only for what the worker
    reports before it has a job (sandbox set-up errors); anything else on the pipe is ``forged``."""
    if not data:
        return None, False
    mac, payload = data[:_MAC_HEX], data[_MAC_HEX:]
    expected = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()
    if hmac.compare_digest(mac, expected):
        try:
            return json.loads(payload.decode("utf-8")), False
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None, True
    try:
        unsigned = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None, True
    if isinstance(unsigned, dict) and set(unsigned) == {"worker_error"}:
        return unsigned, False
    return None, True
