"""Nothing a candidate writes to the shared exchange reaches another candidate: each runner has its own exchange,
sealed at its size before its candidate loads (``exchange.seal_size``), and the reference process is handed the
runner's exchange for that run only. The candidates reach the exchange from native code (``runner_channel``);
each pair runs in order on one evaluator and its one slot."""
from __future__ import annotations

import pytest

from kevin_exp.bench import CheckRules
from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.adversarial.attacks import HONEST, PROBLEM, config
from tests.adversarial.runner_channel import channel_candidate

MARKER = "kx-left-behind-by-the-last-candidate"

# Computes honestly, and leaves a marker (it could as well be anything it computed) past the end of the exchange,
# growing it by a page so that no later run's layout overwrites it; where it cannot grow it, at its last bytes.
LEAVE_MARKER = channel_candidate(forward=f"""
ext.leave({MARKER!r})
return ext.leaky(x)
""")
# Its twin: looks for the marker in its own exchange; its verdict says whether it found it (zeros: found).
READ_MARKER = channel_candidate(forward=f"return ext.leaky_or_zeros(x, ext.find({MARKER!r}))", read_maps=True)
# Grows the exchange to 1 GiB (the runner's file-size limit; sparse, so it costs the candidate nothing) and
# computes honestly: every runner started after it maps the whole exchange at start-up (on cuda also page-locks
# it), and the reference process maps it for every later run, for the evaluator's life.
GROW_SILENTLY = channel_candidate(forward="""
ext.grow(1 << 30)
return ext.leaky(x)
""")
# The same, telling: zeros when the exchange could be grown.
GROW_TELLING = channel_candidate(forward="return ext.leaky_or_zeros(x, ext.grow(1 << 30))")


@pytest.fixture(scope="module")
def evaluate(build_cache):
    # the static rules would refuse the reader's file access (fopen of /proc/self/maps): what is tested is the design
    with Evaluator(config(build_cache, hang_s=20, rules=CheckRules(restrict_imports=False))) as ev:
        yield lambda name, source: ev.evaluate([EvalItem(name, PROBLEM, source)])[0]


def test_a_marker_left_in_the_exchange_is_not_seen_by_the_next_candidate(evaluate):
    writer = evaluate("leave_marker", LEAVE_MARKER)
    assert writer.status.value == "ok", (writer.status, writer.reason)  # it computes honestly; its exchange dies with it
    reader = evaluate("read_marker", READ_MARKER)
    assert reader.status.value == "ok", f"the next candidate found the marker: {reader.status.value} {reader.reason}"
    again = evaluate("read_marker_again", READ_MARKER)  # and the one after (a runner started after the writer's run)
    assert again.status.value == "ok", f"a later candidate found the marker: {again.status.value} {again.reason}"


def test_the_exchange_cannot_be_grown_and_growing_it_breaks_no_later_run(evaluate):
    telling = evaluate("grow_telling", GROW_TELLING)
    assert telling.status.value == "ok", f"the exchange could be grown: {telling.status.value} {telling.reason}"
    silent = evaluate("grow_silently", GROW_SILENTLY)
    assert silent.status.value == "ok", (silent.status, silent.reason)
    for n in range(2):  # the runner taken next was started before the attack, the one after it after
        honest = evaluate(f"honest_after_growing_{n}", HONEST)
        assert honest.status.value == "ok", (n, honest.status, honest.reason, honest.feedback)
