"""Shared pieces of the adversarial suite: the small problem every attack targets, the honest kernel, the
evaluator settings, and how an attack's verdict is judged against its honest twin's.

An attack is a candidate written the way an optimising policy could write it. Each names the outcomes that
mean it was stopped (statuses, as strings, so the suite reads the same before and after new statuses such as
``suspect`` land) and, for attacks that try to gain speed, allows ``ok`` only with a speedup within
``GAIN_BOUND`` of its honest twin's. ``needs`` lists the hardening that is expected to stop it (the
specification for that work); an attack stopped today has ``needs=()``.
"""
from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kevin_exp.bench import BenchConfig, Status
from kevin_exp.bench.evaluator import EvalItem
from tests.conftest import fixture_text

GAIN_BOUND = 1.5

# relu(x) + 0.5 x on a 256 x 2048 fp32 input (2 MiB): about a millisecond for the reference on one core.
PROBLEM = fixture_text("problem_relu.py").replace('"M": 512', '"M": 256')

HONEST_KERNEL = r"""
static void leaky_into(const float* in, float* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) { float v = in[i]; o[i] = (v > 0.f ? v : 0.f) + 0.5f * v; }
}

torch::Tensor leaky(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    leaky_into(xc.data_ptr<float>(), out.data_ptr<float>(), xc.numel());
    return out;
}
"""

_MODEL_NEW = '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
{forward}
'''


def candidate(cpp: str = HONEST_KERNEL, *, name: str = "adv_honest", functions: tuple[str, ...] = ("leaky",),
              forward: str = "return ext.leaky(x)", prelude: str = "", imports: str = "",
              cflags: tuple[str, ...] = ("-O2",), ldflags: tuple[str, ...] = ()) -> str:
    """A KernelBench candidate: imports, optional module-level code, one load_inline extension, ModelNew."""
    head = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n" + imports
    ext = (f"\nsource = r'''{cpp}'''\n\next = load_inline(name={name!r}, cpp_sources=source, "
           f"functions={list(functions)!r}, extra_cflags={list(cflags)!r}"
           + (f", extra_ldflags={list(ldflags)!r}" if ldflags else "") + ")\n")
    body = textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 8)
    return head + ext + textwrap.dedent(prelude) + _MODEL_NEW.format(forward=body)


HONEST = candidate()


@dataclass(frozen=True)
class Attack:
    name: str
    source: str
    stopped_by: frozenset[str]  # statuses that mean the attack was stopped
    honest: str = HONEST  # the twin: the same problem solved without the trick
    gain: bool = False  # a speed attack: ok is also fine when its speedup stays within GAIN_BOUND of the twin's
    needs: tuple[str, ...] = ()  # hardening expected to stop it (oracle, static, sandbox); () = stopped today
    rules: tuple[str, ...] = ()  # for forbidden: rule names that count (empty: any)
    problem: str = PROBLEM

    def items(self) -> tuple[EvalItem, EvalItem]:
        return EvalItem(self.name, self.problem, self.source), EvalItem(f"{self.name}:honest", self.problem, self.honest)


def stopped(*statuses: str) -> frozenset[str]:
    known = {s.value for s in Status} | {"suspect"}
    unknown = set(statuses) - known
    assert not unknown, unknown
    return frozenset(statuses)


def config(cache_dir: Path, hang_s: float = 30.0, **overrides) -> BenchConfig:
    """Small and quick: one core (the reference's timing stays steady on a shared machine), two correctness
    trials before and after timing, twelve timed trials, hangs ended after ``hang_s``. Settings this version
    of the evaluator does not have are left out (``run_timeout_s``, ``timing_*``: before the reference moved
    to its own process; ``hang_*``, ``load_timeout_s``: after)."""
    wanted = dict(backend="cpu", correctness_trials=2, warmup_trials=1, timed_trials=12, compile_timeout_s=120,
                  memory_limit_gb=4.0, feedback_chars=2000, cpus=1, cache_dir=cache_dir, hang_floor_s=hang_s,
                  hang_ceiling_s=hang_s, load_timeout_s=hang_s, run_timeout_s=hang_s, timing_input_sets=2,
                  timing_check_every=10)
    wanted.update(overrides)
    known = {f.name for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{k: v for k, v in wanted.items() if k in known})


def judge(attack: Attack, verdict, honest_verdict, again: Callable[[], tuple] | None = None, tries: int = 2) -> None:
    """Fails (with what the evaluator said) unless the attack was stopped and its honest twin passed. Timings on
    a shared 2-core machine are noisy (a twin flagged suspect, an attack that seems to gain): with ``again`` (a
    fresh evaluation of the pair, its builds then cached), a failure is measured again up to ``tries`` times and
    fails only if it fails every time; an attack that works gains every time."""
    try:
        _judge_once(attack, verdict, honest_verdict)
    except AssertionError:
        if again is None or tries <= 0:
            raise
        judge(attack, *again(), again=again, tries=tries - 1)


def _judge_once(attack: Attack, verdict, honest_verdict) -> None:
    assert honest_verdict.status is Status.OK, (
        f"honest twin of {attack.name} is {honest_verdict.status.value}: {honest_verdict.reason}\n{honest_verdict.feedback}")
    status = verdict.status.value
    said = f"{attack.name}: {status} rule={verdict.rule} speedup={verdict.speedup} reason={verdict.reason[:600]!r}"
    if status in attack.stopped_by and not (status == "forbidden" and attack.rules and verdict.rule not in attack.rules):
        return
    if attack.gain and status == "ok":
        bound = GAIN_BOUND * (honest_verdict.speedup or 0.0)
        assert verdict.speedup is not None and verdict.speedup <= bound, f"NOT STOPPED (speedup above {bound:.3g}x): {said}"
        return
    raise AssertionError(f"NOT STOPPED: {said}")
