"""What a process that has loaded candidate code may say, and how its lines are read.

Every line from a runner is read here and nowhere else: within ``MAX_LINE_BYTES`` (the reply pipe cuts longer
ones), as JSON with no NaN/Infinity literals, integers of at most 19 digits, finite floats and at most
``MAX_DEPTH`` levels of nesting, then checked against the declaration of its message type (``RUNNER``): the keys
it may carry, each one's type and range (ints are never bools, strings and lists are bounded, tensor headers are
``exchange.validate``'d). Anything else is a ``ReplyError`` whose text says what was wrong; the caller ends
the candidate on it (``run_outcome.answered``). The trusted reference process's lines go through ``parse_line``
with NaN allowed (a comparison's largest difference may be one) and no schema.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from kevin_exp.bench.exchange import HeaderError, validate
from kevin_exp.bench.spec import ExtensionSpec

MAX_LINE_BYTES = 1 << 20
MAX_DEPTH = 12  # a done message whose output header nests as deep as `exchange.validate` allows is 11 deep
MAX_INT_DIGITS = 19
MAX_ITEMS = 256
INT64 = 1 << 63

Check = Callable[[Any], "str | None"]  # why a value is not allowed; None when it is


class ReplyError(ValueError):
    """A line that is not a message the reading side accepts: the text says what is wrong with it."""


# --------------------------------------------------------------------------- reading a line

def _no_constant(name: str) -> Any:
    raise ReplyError(f"the literal {name} is not allowed")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ReplyError(f"an integer of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ReplyError(f"the number {text[:40]} is not finite")
    return value


def _depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` levels (stops as soon as it does not)."""
    if isinstance(value, dict):
        return limit > 0 and all(_depth(v, limit - 1) for v in value.values())
    if isinstance(value, list):
        return limit > 0 and all(_depth(v, limit - 1) for v in value)
    return True


def parse_line(line: bytes, strict: bool = True) -> dict[str, Any]:
    """One line as a JSON object, or ``ReplyError``. ``strict`` (a runner's line): also no NaN/Infinity, no
    integer over 19 digits, finite floats only."""
    if len(line) > MAX_LINE_BYTES:
        raise ReplyError(f"a line of {len(line)} bytes (at most {MAX_LINE_BYTES})")
    try:
        text = line.decode("utf-8")
        if strict:
            value = json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int, parse_float=_finite_float)
        else:
            value = json.loads(text)
    except ReplyError:
        raise
    except RecursionError:
        raise ReplyError(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise ReplyError("not UTF-8") from None
    except ValueError as exc:  # JSONDecodeError, and int() refusing a huge literal
        raise ReplyError(f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise ReplyError(f"a JSON {type(value).__name__}, not an object")
    if not _depth(value, MAX_DEPTH):
        raise ReplyError(f"nested deeper than {MAX_DEPTH} levels")
    return value


# --------------------------------------------------------------------------- field checks

def integer(lo: int = -INT64, hi: int = INT64 - 1) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, int) or isinstance(v, bool):
            return f"must be an integer, not {_kind(v)}"
        return None if lo <= v <= hi else f"{v} is outside [{lo}, {hi}]"
    return check


def choice(*values: str) -> Check:
    return lambda v: None if isinstance(v, str) and v in values else f"must be one of {', '.join(values)}"


def number(lo: float = 0.0, hi: float = 1e12) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return f"must be a number, not {_kind(v)}"
        return None if math.isfinite(v) and lo <= v <= hi else f"{v} is outside [{lo}, {hi}]"
    return check


def text(max_chars: int) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, str):
            return f"must be a string, not {_kind(v)}"
        if len(v) > max_chars:
            return f"a string of {len(v)} characters (at most {max_chars})"
        return None if _encodable(v) else "a string that is not valid unicode (a lone surrogate)"
    return check


def _encodable(v: str) -> bool:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def build_spec(v: Any) -> str | None:
    """The arguments of a ``load_inline`` call (``spec.ExtensionSpec``'s fields): a name, strings, lists of
    strings, a bool or null; the evaluator checks what they say before anything is built."""
    if not isinstance(v, dict):
        return f"must be an object, not {_kind(v)}"
    fields = {f.name for f in dataclasses.fields(ExtensionSpec)}
    unknown = set(v) - fields
    if unknown:
        return f"unknown keys {sorted(k[:40] for k in unknown)[:5]}"
    if not isinstance(v.get("name"), str):
        return "lacks a name"
    for key, value in v.items():
        ok = value is None or isinstance(value, (bool, str)) or (
            isinstance(value, list) and len(value) <= 4096 and all(isinstance(x, str) for x in value))
        if not ok:
            return f"{key!r} must be a string, a list of strings, a bool or null"
    return _plain(v, 2, 4096, 1 << 20)


def nullable(inner: Check) -> Check:
    return lambda v: None if v is None else inner(v)


def header(v: Any) -> str | None:
    """A tensor header (``exchange``): its structure; where its bytes lie is checked by the reference process."""
    try:
        validate(v, 0, INT64)
    except HeaderError as exc:
        return str(exc)[:200]
    return _plain(v, MAX_DEPTH, 64, 1000)


def fingerprint(v: Any) -> str | None:
    """An input fingerprint (``sampling.fingerprint``): a list, one entry per input leaf."""
    return _plain(v, 3, 256, 200) if isinstance(v, list) else f"must be a list, not {_kind(v)}"


def seconds_by_name(max_items: int, max_chars: int) -> Check:
    """An object of names to durations (``loaded.load_phases``): each key a short name, each value seconds."""
    seconds = number(0.0, 1e6)

    def check(v: Any) -> str | None:
        if not isinstance(v, dict):
            return f"must be an object, not {_kind(v)}"
        why = _plain(v, 1, max_items, max_chars)
        return why or next((f"{k}: {w}" for k, x in v.items() if (w := seconds(x))), None)
    return check


def plain(depth: int, max_items: int, max_chars: int) -> Check:
    """Plain JSON data (a fingerprint, a build spec): bounded nesting, list lengths, strings and numbers."""
    return lambda v: _plain(v, depth, max_items, max_chars)


def _plain(v: Any, depth: int, max_items: int, max_chars: int) -> str | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return None if -INT64 <= v < INT64 else "an integer outside int64"
    if isinstance(v, float):
        return None if math.isfinite(v) else "a number that is not finite"
    if isinstance(v, str):
        if len(v) > max_chars:
            return f"a string of {len(v)} characters (at most {max_chars})"
        return None if _encodable(v) else "a string that is not valid unicode (a lone surrogate)"
    if depth <= 0:
        return "nested too deep"
    if isinstance(v, list):
        if len(v) > max_items:
            return f"a list of {len(v)} items (at most {max_items})"
        items = v
    elif isinstance(v, dict):
        if len(v) > max_items:
            return f"an object of {len(v)} keys (at most {max_items})"
        items = list(v.values())
        if any(len(k) > max_chars or not _encodable(k) for k in v):
            return "an over-long or invalid key"
    else:
        return f"a {_kind(v)}"
    for item in items:
        why = _plain(item, depth - 1, max_items, max_chars)
        if why:
            return why
    return None


def _kind(v: Any) -> str:
    return {bool: "a bool", type(None): "null", str: "a string", list: "a list", dict: "an object",
            float: "a float", int: "an integer"}.get(type(v), type(v).__name__)


# --------------------------------------------------------------------------- the runner's messages

@dataclass(frozen=True)
class Message:
    required: dict[str, Check] = field(default_factory=dict)
    optional: dict[str, Check] = field(default_factory=dict)


CALL_INDEX = integer(-(1 << 20), 1 << 20)
MILLISECONDS = number(0.0, 1e9)
REASON = text(100_000)

RUNNER: dict[str, Message] = {
    # start-up ("ready" with no index) and a staged call ("ready" with its index)
    "ready": Message(optional={"i": CALL_INDEX, "busy_ms": MILLISECONDS, "fingerprint": fingerprint}),
    "problem_ready": Message(),
    "device_region": Message({"where": choice("device", "host")}, {"why": text(1000)}),
    "loaded": Message({"device": text(200), "load_s": number(0.0, 1e6)}, {"load_phases": seconds_by_name(16, 40)}),
    "ran": Message({"i": CALL_INDEX, "ms": nullable(MILLISECONDS)}),
    "done": Message({"i": CALL_INDEX, "outputs": header, "after": header},
                    {"shape": header, "busy_ms": MILLISECONDS}),
    "ended": Message(),
    "rejected": Message({"status": text(40), "reason": REASON},
                        {"rule": nullable(text(200)), "detail": text(500_000)}),
    "needs_build": Message({"spec": build_spec}),
    "worker_error": Message({"reason": REASON}),
}


def check_runner_message(message: dict[str, Any]) -> None:
    """``ReplyError`` unless ``message`` is one of ``RUNNER``'s messages, with exactly the keys it may carry."""
    op = message.get("op")
    declared = RUNNER.get(op) if isinstance(op, str) else None
    if declared is None:
        raise ReplyError(f"unknown message {str(op)[:40]!r}")
    extra = set(message) - {"op"} - set(declared.required) - set(declared.optional)
    if extra:
        raise ReplyError(f"{op!r} may not carry {', '.join(sorted(repr(k[:40]) for k in extra)[:5])}")
    for key, check in declared.required.items():
        if key not in message:
            raise ReplyError(f"{op!r} lacks {key!r}")
    for key, check in (*declared.required.items(), *declared.optional.items()):
        if key in message:
            why = check(message[key])
            if why:
                raise ReplyError(f"{op!r} field {key!r}: {why}")


def read_runner_line(line: bytes) -> dict[str, Any]:
    """A runner's line, parsed and checked (``ReplyError`` otherwise)."""
    message = parse_line(line, strict=True)
    check_runner_message(message)
    return message
