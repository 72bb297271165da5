"""Unbiased best-of-k estimates from n > k samples (Chen et al. 2021, the pass@k estimator Kevin's scaling
curves use, section 5.3): drawing k of the n samples without replacement, the expected best of the k."""
from __future__ import annotations

from functools import lru_cache
from math import comb
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws from n samples, c of them correct, is correct) = 1 - C(n-c, k) / C(n, k)."""
    _check(n, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


@lru_cache(maxsize=None)
def _max_weights(n: int, k: int) -> np.ndarray:
    # the i-th smallest of n values (1-based) is the max of a k-subset in C(i-1, k-1) of the C(n, k) subsets;
    # Python's int / int is correctly rounded, so the weights stay exact for large n
    total = comb(n, k)
    return np.array([comb(i - 1, k - 1) / total for i in range(1, n + 1)])


def expected_max_of_k(values: Sequence[float] | np.ndarray, k: int) -> float:
    """E[max of k values drawn without replacement] = sum_i v_(i) C(i-1, k-1) / C(n, k), v sorted ascending.
    For 0/1 values this is ``pass_at_k``."""
    ordered = np.sort(np.asarray(values, dtype=float))
    _check(len(ordered), k)
    return float(ordered @ _max_weights(len(ordered), k))


def _check(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"best-of-k needs 1 <= k <= n, got k={k}, n={n}")
