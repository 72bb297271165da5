"""The worker's result channel: only a result signed with the job's key counts."""
from __future__ import annotations

import json
import secrets

from kevin_exp.bench.result_channel import RESULT_KEY_BYTES, read_signed_result, sign_result

RESULT = {"status": "ok", "runtime_stats": {"median_ms": 1.0}}


def payload(obj: dict) -> bytes:
    return json.dumps(obj).encode()


def test_a_signed_result_is_read_back() -> None:
    key = secrets.token_bytes(RESULT_KEY_BYTES)
    assert read_signed_result(key, sign_result(bytearray(key), payload(RESULT))) == (RESULT, False)


def test_an_unsigned_result_is_forged() -> None:
    key = secrets.token_bytes(RESULT_KEY_BYTES)
    assert read_signed_result(key, payload(RESULT)) == (None, True)


def test_a_result_signed_with_another_key_is_forged() -> None:
    key, other = secrets.token_bytes(RESULT_KEY_BYTES), secrets.token_bytes(RESULT_KEY_BYTES)
    assert read_signed_result(key, sign_result(other, payload(RESULT))) == (None, True)


def test_an_altered_payload_is_forged() -> None:
    key = secrets.token_bytes(RESULT_KEY_BYTES)
    signed = sign_result(key, payload(RESULT))
    assert read_signed_result(key, signed.replace(b"1.0", b"0.001")) == (None, True)


def test_bytes_written_before_the_real_result_make_it_forged() -> None:
    """A candidate that writes its own message and lets the worker carry on: the pipe holds both."""
    key = secrets.token_bytes(RESULT_KEY_BYTES)
    data = payload({"status": "ok"}) + sign_result(key, payload(RESULT))
    assert read_signed_result(key, data) == (None, True)


def test_nothing_on_the_pipe_is_no_result_not_a_forgery() -> None:
    assert read_signed_result(secrets.token_bytes(RESULT_KEY_BYTES), b"") == (None, False)


def test_a_sandbox_setup_error_before_the_job_is_accepted_unsigned() -> None:
    key = secrets.token_bytes(RESULT_KEY_BYTES)
    error = {"worker_error": "sandbox setup failed: mount"}
    assert read_signed_result(key, payload(error)) == (error, False)
    assert read_signed_result(key, payload({**error, "status": "ok"})) == (None, True)
