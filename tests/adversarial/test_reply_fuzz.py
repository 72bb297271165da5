"""A runner's reply cannot break the evaluator: every line a runner writes is read under ``replies``' limits and
message declarations. Three levels: the parser alone, on many random and adversarial lines for every message type;
the reply pipe of a real child process (a 100 MB line, a line cut by EOF, floods); and end to end, candidates
whose native code writes bad replies on the runner's reply pipe at load and during calls, each followed on the
same evaluator and slot by an honest candidate that must get its normal verdict."""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

from kevin_exp.bench.evaluator import EvalItem, Evaluator
from kevin_exp.bench.replies import MAX_DEPTH, RUNNER, ReplyError, read_runner_line
from kevin_exp.bench.worker_process import ChildProcess, Ended, WorkerProcess
from tests.adversarial.attacks import HONEST, PROBLEM, config
from tests.adversarial.runner_channel import channel_candidate

# one valid message of every type, as the runner sends them
VALID: dict[str, dict] = {
    "ready": {"op": "ready", "i": 3, "busy_ms": 0.5, "fingerprint": [["float32", [256, 2048], 123456789], 2.5]},
    "problem_ready": {"op": "problem_ready"},
    "device_region": {"op": "device_region", "where": "host", "why": "the driver refused"},
    "loaded": {"op": "loaded", "device": "cpu", "load_s": 0.25, "load_phases": {"region": 0.2, "module": 0.01}},
    "ran": {"op": "ran", "i": 3, "ms": 0.8},
    "done": {"op": "done", "i": 3, "busy_ms": 1.0,
             "outputs": {"t": "tensor", "dtype": "float32", "shape": [256, 2048], "offset": 2097152, "nbytes": 2097152},
             "after": {"t": "list", "items": []},
             "shape": {"t": "tuple", "items": [{"t": "value", "value": 1.5}, {"t": "value", "value": None}]}},
    "ended": {"op": "ended"},
    "rejected": {"op": "rejected", "status": "incorrect", "reason": "wrong", "rule": None, "detail": "trace"},
    "needs_build": {"op": "needs_build", "spec": {"name": "e", "cpp_sources": ["int f() { return 1; }"],
                                                  "functions": ["f"], "with_cuda": None}},
    "worker_error": {"op": "worker_error", "reason": "it broke"},
}
DEEP = "[" * 100_000 + "]" * 100_000
BAD_VALUES = [True, False, None, -1, 1 << 70, 1.5, "x" * 600_000, "\ud800", {}, [], [[[[[[[[[[1]]]]]]]]]],
              {"t": "tensor"}, list(range(5000))]
RAW_BAD = [
    DEEP.encode(), ("{\"op\": \"ran\", \"i\": 0, \"ms\": " + DEEP + "}").encode(), b'{"op": "ran", "i": 0, "ms": NaN}',
    b'{"op": "ran", "i": 0, "ms": Infinity}', b'{"op": "ran", "i": 0, "ms": -Infinity}', b'{"op": "ran", "i": 0, "ms": 1e999}',
    b'{"op": "ran", "i": ' + b"9" * 5000 + b', "ms": 1}', b'{"op": "ran", "i": true, "ms": 1}', b'{"op": "ran", "i": 0}',
    b'{"op": "ran", "i": 0, "ms": 1, "ok": true}', b'{"op": "ran", "i": 0, "ms": -1}', b'{"op": "ran", "i": 0, "ms": "1"}',
    b"\xff\xfe{}", b'{"op": "ran", "i": 0, "ms": 1', b"", b"null", b"[]", b'"ran"', b"{}", b'{"op": 1}',
    b'{"op": "loaded", "device": "\\ud800", "load_s": 0}', b'{"op": "status", "status": "ok"}',
    b'{"op": "rejected", "status": ["ok"], "reason": "x"}', b'{"op": "needs_build", "spec": {"name": "x", "cpp_sources": [1]}}',
    b'{"op": "needs_build", "spec": {"name": "x", "run": "rm -rf /"}}', b"x" * (2 << 20),
    b'{"op": "done", "i": 0, "outputs": {"t": "value", "value": "' + b"x" * 2000 + b'"}, "after": {"t": "list", "items": []}}',
    b'{"op": "done", "i": 0, "outputs": {"t": "tensor", "dtype": "object", "shape": [1], "offset": 0, "nbytes": 8}, '
    b'"after": {"t": "list", "items": []}}',
]


def _outcome(line: bytes) -> str:
    try:
        read_runner_line(line)
    except ReplyError:
        return "refused"
    return "accepted"


@pytest.mark.parametrize("op", sorted(VALID))
def test_every_message_type_is_read_and_every_change_to_a_field_is_judged(op):
    message = VALID[op]
    assert set(VALID) == set(RUNNER)
    assert read_runner_line(json.dumps(message).encode()) == message
    with pytest.raises(ReplyError):  # an undeclared key
        read_runner_line(json.dumps({**message, "speedup": 1000.0}).encode())
    for key in message:
        if key == "op":
            continue
        if key in RUNNER[op].required:
            with pytest.raises(ReplyError):
                read_runner_line(json.dumps({k: v for k, v in message.items() if k != key}).encode())
        for bad in BAD_VALUES:
            _outcome(json.dumps({**message, key: bad}).encode())  # refused or accepted: never anything else
        for bad in (True, 1 << 70, "x" * 600_000, "\ud800", list(range(5000))):
            assert _outcome(json.dumps({**message, key: bad}).encode()) == "refused", (op, key, str(bad)[:40])


@pytest.mark.parametrize("line", RAW_BAD, ids=range(len(RAW_BAD)))
def test_adversarial_lines_are_refused_with_a_reason(line):
    with pytest.raises(ReplyError) as caught:
        read_runner_line(line)
    assert str(caught.value)


def _random_json(rng: random.Random, depth: int) -> object:
    kind = rng.randrange(9 if depth < 12 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 1 << rng.randrange(80), rng.randrange(-10**6, 10**6)])
    if kind == 2:
        return rng.choice([0.5, -0.0, 1e308, rng.random()])
    if kind in (3, 4):
        return "".join(rng.choice("ab\u00e9\u2603\"\\") for _ in range(rng.randrange(6)))
    if kind in (5, 6):
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["op", "i", "ms", "t", "items", "x"]): _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_random_replies_are_refused_or_well_formed():
    rng = random.Random(28)
    accepted = 0
    for n in range(20_000):
        op = rng.choice(sorted(VALID))
        message = dict(VALID[op])
        for _ in range(rng.randrange(1, 4)):
            message[rng.choice([*message, "extra"])] = _random_json(rng, 0)
        line = json.dumps(message).encode()
        if n % 7 == 0:  # cut, spliced or with a byte changed
            cut = rng.randrange(len(line) + 1)
            line = line[:cut] + (bytes([rng.randrange(256)]) if n % 2 else b"") + line[cut + 1:]
        try:
            got = read_runner_line(line)
        except ReplyError:
            continue
        accepted += 1
        declared = RUNNER[got["op"]]
        assert set(got) <= {"op", *declared.required, *declared.optional}
        assert json.loads(json.dumps(got)) == got  # plain, finite, re-encodable data
    assert accepted  # the generator also makes valid messages


# ------------------------------------------------------------------------------------------- the reply pipe

class _ReplyChild(ChildProcess):
    """A child read exactly as a runner is (``WorkerProcess``' line reading), without the sandbox."""

    strict = WorkerProcess.strict
    _read_line = WorkerProcess._read_line


WRITER = r"""
import os, sys, time
fd, how, then = int(sys.argv[1]), sys.argv[2], sys.argv[3]
data = {"deep": b"[" * 100000 + b"]" * 100000 + b"\n", "cut": b'{"op": "ready", "i": 0, "busy',
        "huge": b"x" * 100_000_000, "flood": b'{"op": "ready"}\n' * 200000, "empty": b"\n" * 100000,
        "nan": b'{"op": "ran", "i": 0, "ms": NaN}\n'}[how]
try:
    os.write(fd, data) if len(data) < 65536 else [os.write(fd, data[k:k + 65536]) for k in range(0, len(data), 65536)]
except OSError:
    pass
if then == "exit":
    os._exit(0)
while True:
    time.sleep(1000)
"""


@pytest.mark.parametrize("how, then, first", [
    ("deep", "spin", "garbage"), ("cut", "exit", "garbage"), ("huge", "spin", "garbage"), ("empty", "spin", "garbage"),
    ("nan", "exit", "garbage"), ("flood", "spin", "ready"),
])
def test_a_runner_that_writes_a_bad_line_is_ended_on_it(tmp_path: Path, how, then, first):
    read_fd, write_fd = os.pipe()
    child = _ReplyChild([sys.executable, "-c", WRITER, str(write_fd), how, then], dict(os.environ), write_fd, read_fd,
                        (), 1 << 34, 1 << 16)
    try:
        got = child.recv(time.monotonic() + 60)
        if first == "ready":  # a flood of valid lines reads as valid lines: the protocol refuses the second one
            assert got == {"op": "ready"}
            assert child.alive()
        else:
            # a child that exits right after its cut line may be seen ending before the line is (on a busy box)
            assert isinstance(got, Ended) and (got.how == "garbage" or then == "exit" and got.how != "timeout"), got
            assert got.detail
            assert child.proc.returncode is not None or not child.alive()  # ended on the line, not on a timeout
    finally:
        child.close()
    assert child.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(child.proc.pid, 0)


# ------------------------------------------------------------------------------------------- end to end

def _fake(message: dict) -> str:
    return json.dumps(message) + "\n"


LOADED = _fake({"op": "loaded", "device": "cpu", "load_s": 0.1})
EMPTY = {"t": "list", "items": []}


def _ran(i: int) -> str:
    return _fake({"op": "ran", "i": i, "ms": 0.5})


# (name, where: "load" or the call index whose "go" writes it, the payload as a Python expression, then)
END_TO_END = [
    ("load_deep_nesting", "load", "'[' * 100000 + ']' * 100000 + '\\n'", "spin"),
    ("load_deep_in_a_field", "load",
     "'{\"op\": \"loaded\", \"device\": ' + '[' * 100000 + ']' * 100000 + ', \"load_s\": 0.1}\\n'", "exit"),
    ("load_huge_number", "load", "'{\"op\": \"loaded\", \"device\": \"cpu\", \"load_s\": ' + '9' * 5000 + '}\\n'", "spin"),
    ("load_nan_literal", "load", repr('{"op": "loaded", "device": "cpu", "load_s": NaN}\n'), "spin"),
    ("load_wrong_type", "load", repr('{"op": "loaded", "device": ["cpu"], "load_s": 0.1}\n'), "spin"),
    ("load_unicode", "load", repr('{"op": "loaded", "device": "\\ud800\\u2603", "load_s": 0.1}\n'), "spin"),
    ("load_cut_then_eof", "load", repr('{"op": "loaded", "dev'), "exit"),
    ("load_100_mb_line", "load", "'x' * 100_000_000", "spin"),
    ("load_flood", "load", repr(LOADED) + " * 100000", "spin"),
    ("load_bad_build_spec", "load", repr(_fake({"op": "needs_build", "spec": {"name": "x", "cpp_sources": [1, 2]}})), "exit"),
    ("ready_bool_for_index", "load", repr(LOADED + _fake({"op": "ready", "i": False})), "spin"),
    ("ready_deep_fingerprint", "load", repr(LOADED) + " + '{\"op\": \"ready\", \"i\": 0, \"fingerprint\": ' + '[' * 50 "
     "+ ']' * 50 + '}\\n'", "spin"),
    ("ran_extra_key", 0, repr(_fake({"op": "ran", "i": 0, "ms": 0.5, "status": "ok"})), "spin"),
    ("ran_other_call_index", 0, repr(_fake({"op": "ran", "i": 7, "ms": 0.5})), "spin"),
    ("ran_bool_for_index", 1, repr(_fake({"op": "ran", "i": True, "ms": 0.5})), "spin"),
    ("ran_infinity", 3, repr('{"op": "ran", "i": 3, "ms": Infinity}\n'), "spin"),
    # the reference process has been asked to check call 2 (a sampled check, answered after call 3 has run) when
    # the bad line comes where call 3's "ready" should: the run must still take the reference's answer
    ("ready_deep_while_the_reference_checks", 2, repr(_ran(2) + _fake({"op": "done", "i": 2, "outputs": EMPTY,
                                                                       "after": EMPTY, "shape": EMPTY}))
     + " + '[' * 100000 + ']' * 100000 + '\\n'", "spin"),
    # a valid "ran" written during a timed call, before it returns, stops the parent's clock early; the harness's own "ran"
    # then comes where "done" should
    ("ran_early_then_the_work", 3, repr(_fake({"op": "ran", "i": 3, "ms": 0.001})), "go_on"),
    ("done_before_ran", 0, repr(_fake({"op": "done", "i": 0, "outputs": EMPTY, "after": EMPTY})), "spin"),
    ("done_deep_header", 0, repr(_ran(0)) + " + '{\"op\": \"done\", \"i\": 0, \"outputs\": ' + '[' * 100000 + ']' * 100000 "
     "+ ', \"after\": {\"t\": \"list\", \"items\": []}}\\n'", "spin"),
    ("done_nan_value", 0, repr(_ran(0)) + " + '{\"op\": \"done\", \"i\": 0, \"outputs\": {\"t\": \"value\", \"value\": NaN}, "
     "\"after\": {\"t\": \"list\", \"items\": []}}\\n'", "exit"),
]


def attack_source(where: object, payload: str, then: str) -> str:
    strike = f"ext.strike({payload}, {dict(exit=0, spin=1, go_on=2)[then]})"
    if where == "load":
        return channel_candidate(init=strike)
    return channel_candidate(prelude="\nCALLS = []\n", forward=f"""
out = ext.leaky(x)
CALLS.append(1)
if len(CALLS) == {int(where) + 1}:
    {strike}
return out
""")


@pytest.fixture(scope="module")
def evaluator(build_cache):
    # the cases name the calls they strike at by index: the schedule without the hidden checks' extra calls
    with Evaluator(config(build_cache, hang_s=20, check_distributions=False, hidden_shape_check=False)) as ev:
        [slot] = ev._slots  # one slot on cpu: every run below goes through it
        taken: list = []
        take = slot._take

        def recorded():
            worker = take()
            taken.append(worker)
            return worker

        slot._take = recorded
        ev.taken = taken
        yield ev


def _gone(worker, slot) -> bool:
    """The runner was killed and waited for, and its pid names no running process (a zombie the fork server has
    yet to reap is dead)."""
    for reaper in slot._reapers:
        reaper.join(timeout=15)
    if worker.proc.returncode is None:
        return False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{worker.proc.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in (b"Z", b"X"):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("name, where, payload, then", END_TO_END, ids=[c[0] for c in END_TO_END])
def test_a_bad_reply_ends_its_candidate_and_kills_its_runner_and_the_next_one_is_judged_as_ever(evaluator, name, where,
                                                                                                 payload, then):
    [attack] = evaluator.evaluate([EvalItem(name, PROBLEM, attack_source(where, payload, then))])
    runner = evaluator.taken[-1]
    if name == "ready_deep_while_the_reference_checks":
        # every call is checked before the runner is sent anything more: the forged but well-formed "done" of call 2
        # is checked at once, and its empty output is wrong, before the bad line is ever read
        assert attack.status.value == "incorrect", (attack.status, attack.reason)
    else:
        assert attack.status.value in ("forbidden", "crashed"), (attack.status, attack.reason)
        assert attack.reason.startswith("protocol_violation: "), attack.reason
    assert not attack.correct and attack.speedup is None
    assert _gone(runner, evaluator._slots[0]), (f"runner {runner.proc.pid} of {name} is still there "
                                                f"(returncode {runner.proc.returncode}, {attack.reason})")
    [honest] = evaluator.evaluate([EvalItem(f"{name}:honest", PROBLEM, HONEST)])
    assert honest.status.value == "ok", (honest.status, honest.reason, honest.feedback)


def test_the_reply_limits_are_what_the_module_says():
    assert MAX_DEPTH >= 7  # a done message with a nested output header
    line = json.dumps({**VALID["done"], "outputs": {"t": "list", "items": [{"t": "tuple", "items": [
        {"t": "list", "items": [{"t": "value", "value": 1}]}]}]}}).encode()
    assert read_runner_line(line)["op"] == "done"

