"""Confidence intervals for probing scores: over seeds (t or bootstrap) and over test items (bootstrap).

- `mean_ci(values)`: mean of per-seed scores with a 95% interval, either Student-t
  (mean +- t_{0.975, n-1} * sd / sqrt(n)) or percentile bootstrap over the values.
- `bootstrap_ci(items, statistic)`: percentile bootstrap over test items (Efron & Tibshirani 1993):
  resample the N rows of `items` with replacement B times, apply `statistic`, take the 2.5% and
  97.5% quantiles. Resamples are drawn in chunks so memory stays O(chunk * N).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from scipy import stats as _st


def mean_ci(values: Sequence[float], level: float = 0.95, method: str = "t", n_boot: int = 2000,
            seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of per-seed values; with fewer than 2 finite values low = high = nan."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(v.mean())
    if v.size < 2:
        return m, float("nan"), float("nan")
    if method == "t":
        half = _st.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
        return m, float(m - half), float(m + half)
    if method == "bootstrap":
        _, lo, hi = bootstrap_ci(v, np.mean, level=level, n_boot=n_boot, seed=seed)
        return m, lo, hi
    raise ValueError(f"mean_ci: method={method!r} is unknown; choose 't' or 'bootstrap'")


def bootstrap_ci(items: np.ndarray, statistic: Callable[[np.ndarray], float] = np.mean, level: float = 0.95,
                 n_boot: int = 1000, seed: int = 0, chunk_elems: int = 4_000_000) -> tuple[float, float, float]:
    """(statistic(items), low, high): percentile bootstrap over the rows of `items` ((N,) or (N, k)).

    `statistic` maps a resampled array of the same shape to a float (e.g. np.mean, or micro-F1 from
    per-item (tp, fp, fn) counts via `micro_f1_from_counts`).
    """
    items = np.asarray(items)
    n = len(items)
    if n == 0:
        raise ValueError("bootstrap_ci: no items")
    point = float(statistic(items))
    rng = np.random.default_rng(seed)
    per_chunk = max(1, chunk_elems // n)
    boots: list[float] = []
    while len(boots) < n_boot:
        idx = rng.integers(0, n, size=(min(per_chunk, n_boot - len(boots)), n))
        boots.extend(float(statistic(items[i])) for i in idx)
    lo, hi = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2])
    return point, float(lo), float(hi)


def micro_f1_from_counts(counts: np.ndarray) -> float:
    """Micro-F1 from per-item (tp, fp, fn) columns: 2 sum tp / (2 sum tp + sum fp + sum fn)."""
    tp, fp, fn = counts.sum(axis=0)
    d = 2 * tp + fp + fn
    return float(2 * tp / d) if d else 1.0
