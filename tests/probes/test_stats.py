"""Confidence intervals by hand."""
import numpy as np
import pytest

from probes.stats import bootstrap_ci, mean_ci, micro_f1_from_counts


def test_t_interval_by_hand():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / np.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
    assert (m, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))


def test_single_value_has_no_interval_and_bad_method_raises():
    m, lo, hi = mean_ci([0.7])
    assert m == 0.7 and np.isnan(lo) and np.isnan(hi)
    with pytest.raises(ValueError, match="method"):
        mean_ci([1, 2], method="wald")


def test_bootstrap_over_items_matches_binomial_width():
    rng = np.random.default_rng(0)
    correct = (rng.random(2000) < 0.8).astype(float)
    v, lo, hi = bootstrap_ci(correct, n_boot=500, seed=0)
    assert v == correct.mean()
    se = np.sqrt(v * (1 - v) / 2000)
    assert lo < v < hi and (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert mean_ci(correct[:50], method="bootstrap")[1] < correct[:50].mean()


def test_micro_f1_from_counts_by_hand():
    counts = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 1]])  # tp=2, fp=1, fn=2
    assert micro_f1_from_counts(counts) == pytest.approx(4 / 7)
