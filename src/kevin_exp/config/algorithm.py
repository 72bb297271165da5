"""The ``algorithm`` group: the advantage estimator, the loss and the reward's weights (the discount ``gamma`` and
the loss's ``normalization`` are headline settings of the run: ``config/schema.py``)."""
from __future__ import annotations

from dataclasses import dataclass

from kevin_exp.settings_checks import choice, number


def _estimators() -> list[str]:
    from kevin_exp.rl.advantages import estimators

    return estimators()


@dataclass
class AlgorithmConfig:
    # advantage estimator from the registry in kevin_exp.rl.advantages: grpo | trloo
    estimator: str = choice("grpo", _estimators)
    # divide by the group's std (GRPO); off = Dr. GRPO
    scale_by_std: bool = True
    # returns: sum or max over later turns (Kevin section 4.3)
    aggregation: str = choice("sum", ("sum", "max"))
    clip_low: float = number(0.2, ge=0, lt=1)
    clip_high: float = number(0.28, ge=0)
    # KL coefficient; a frozen reference policy is only kept when > 0
    kl_coef: float = number(0.0, ge=0)
    # per-turn score = correctness_weight * correct + speedup_weight * min(speedup, max_speedup) * correct (Kevin 3.2;
    # rl/reward.py); max_speedup 0: no cap
    correctness_weight: float = number(0.3, ge=0)
    speedup_weight: float = number(1.0, ge=0)
    max_speedup: float = number(0.0, ge=0)
