"""Every attack of a test module is evaluated in one batch with its honest twins (compiles run in parallel,
identical extensions are built once), then each test judges one verdict."""
from __future__ import annotations

import pytest

from kevin_exp.bench.evaluator import EvalItem, Evaluator
from tests.adversarial.attacks import config


def evaluate_attacks(attacks, cfg) -> dict[str, tuple]:
    """{attack name: (attack verdict, honest twin verdict)}; identical twins run once, before their attacks."""
    items: list[EvalItem] = []
    twin_index: dict[tuple[str, str], int] = {}
    where: dict[str, tuple[int, int]] = {}
    for attack in attacks:
        bad, good = attack.items()
        key = (attack.problem, attack.honest)
        if key not in twin_index:  # the twin first: it may leave behind what its attack tries to use
            twin_index[key] = len(items)
            items.append(good)
        items.append(bad)
        where[attack.name] = (len(items) - 1, twin_index[key])
    with Evaluator(cfg) as ev:
        verdicts = ev.evaluate(items)
    return {name: (verdicts[i], verdicts[j]) for name, (i, j) in where.items()}


class Judged(dict):
    """{attack name: (attack verdict, honest twin verdict)}, and how to measure one pair again."""

    def __init__(self, pairs: dict[str, tuple], cfg) -> None:
        super().__init__(pairs)
        self.cfg = cfg

    def again(self, attack):
        return lambda: evaluate_attacks([attack], self.cfg)[attack.name]


@pytest.fixture(scope="module")
def verdicts(request, build_cache):
    """The module's ATTACKS, judged under its CONFIG overrides."""
    cfg = config(build_cache, **getattr(request.module, "CONFIG", {}))
    return Judged(evaluate_attacks(request.module.ATTACKS, cfg), cfg)
