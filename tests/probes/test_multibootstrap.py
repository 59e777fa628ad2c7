"""The multi-bootstrap (Sellam et al. 2022) on planted seeds and items whose answers are known."""

import numpy as np
import pytest

from probes.layers import center_of_gravity, differential_scores
from probes.multibootstrap import (
    Comparison,
    Interval,
    _micro_f1_from_sums,
    best_layer_score,
    compare,
    compare_seeds_only,
    expected_layer_delta,
    layer_curve,
    multi_bootstrap,
    score,
    seeds_only,
)
from probes.stats import micro_f1_from_counts


def planted(p: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 4) items with exactly round(p * n) correct, shuffled; tp = correct, fp = fn = 1 - correct."""
    c = np.zeros(n)
    c[: round(p * n)] = 1.0
    c = rng.permutation(c)
    return np.stack([c, c, 1 - c, 1 - c], axis=1)


def system(ps, n: int, seed: int) -> np.ndarray:
    """(S, n, 4): one planted seed per accuracy in ps."""
    rng = np.random.default_rng(seed)
    return np.stack([planted(p, n, rng) for p in ps])


def width(iv) -> float:
    return iv.high - iv.low


def test_score_by_hand():
    items = np.array([[1, 2, 0, 1], [0, 0, 1, 1], [1, 1, 0, 0], [0, 0, 1, 0]], dtype=float)
    assert score(items, "accuracy") == pytest.approx(0.5)
    assert score(items, "micro_f1") == pytest.approx(6 / 10)  # tp 3, fp 2, fn 2


def test_vectorised_micro_f1_matches_stats_on_a_resample():
    rng = np.random.default_rng(3)
    items = rng.integers(0, 3, size=(50, 4)).astype(float)
    idx = rng.integers(0, 50, size=50)
    w = np.bincount(idx, minlength=50).astype(float)
    assert _micro_f1_from_sums(w @ items, 50) == pytest.approx(micro_f1_from_counts(items[idx, 1:4]))
    assert _micro_f1_from_sums(np.zeros(4), 50) == micro_f1_from_counts(np.zeros((3, 3))) == 1.0


def test_items_only_interval_has_binomial_width():
    n = 2000
    iv = multi_bootstrap(system([0.7], n, 0), n_boot=2000, resample_seeds=False)
    expected = 2 * 1.96 * np.sqrt(0.21 / n)
    assert iv.value == pytest.approx(0.7)
    assert iv.low < 0.7 < iv.high
    assert width(iv) == pytest.approx(expected, rel=0.2)
    assert (iv.n_seeds, iv.n_items) == (1, n)


def test_one_seed_gives_the_items_only_interval_and_says_so():
    x = system([0.7], 500, 1)
    both = multi_bootstrap(x, seed=4)
    items_only = multi_bootstrap(x, seed=4, resample_seeds=False)
    assert both.n_seeds == 1
    assert width(both) == pytest.approx(width(items_only), rel=0.15)


def test_seed_variance_widens_the_interval():
    x = system([0.6, 0.7, 0.8], 3000, 2)
    multi = multi_bootstrap(x)
    items_only = multi_bootstrap(x, resample_seeds=False)
    seeds_boot = multi_bootstrap(x, resample_items=False)
    scalar = seeds_only([0.6, 0.7, 0.8])
    assert multi.value == items_only.value == pytest.approx(0.7)
    assert width(multi) > 3 * width(items_only)
    for s in (seeds_boot, scalar):
        assert s.low == pytest.approx(multi.low, abs=0.03)
        assert s.high == pytest.approx(multi.high, abs=0.03)
    assert seeds_boot.low == pytest.approx(0.6)  # P(all three draws = seed 0) = 1/27 > 2.5%
    assert scalar.low == pytest.approx(0.6) and scalar.high == pytest.approx(0.8)
    still = multi_bootstrap(x, resample_seeds=False, resample_items=False)
    assert still.low == still.high == pytest.approx(0.7)


def test_micro_f1_metric_runs_through_the_same_resamples():
    x = system([0.6, 0.7, 0.8], 1000, 5)
    x[..., 2] = 0.0  # no false positives: micro-F1 = 2 tp / (2 tp + fn) = 2a / (1 + a) per seed
    iv = multi_bootstrap(x, "micro_f1", n_boot=300)
    assert iv.value == pytest.approx(np.mean([2 * a / (1 + a) for a in (0.6, 0.7, 0.8)]))
    assert iv.low < iv.value < iv.high


def test_compare_planted_gap_gives_a_claim():
    a = system([0.75, 0.752, 0.748], 3000, 6)
    b = system([0.70, 0.701, 0.699], 3000, 7)
    c = compare(a, b)
    assert isinstance(c, Comparison)
    assert c.delta == pytest.approx(0.05, abs=1e-3)
    assert c.claim == "A > B" and c.low > 0
    assert c.flips == 0 and c.n_seed_pairs == 9
    assert c.p_a_gt_b > 0.975
    assert compare(b, a).claim == "B > A"


def test_compare_equal_systems_gives_no_claim():
    rng = np.random.default_rng(8)
    a = (rng.random((3, 2000, 1)) < 0.7).astype(float)
    b = (rng.random((3, 2000, 1)) < 0.7).astype(float)
    c = compare(*(np.concatenate([x, x, 1 - x, 1 - x], axis=2) for x in (a, b)))
    assert c.low < 0 < c.high
    assert c.claim == "no claim"
    assert 0.025 < c.p_a_gt_b < 0.975


def test_compare_counts_seed_pair_flips_against_the_sign_of_delta():
    b = system([0.70, 0.70, 0.70], 2000, 10)
    # delta = mean(0.72, 0.72, 0.60) - 0.70 = -0.02 < 0: A's seeds 0 and 1 beat every B seed -> 6 flips
    c = compare(system([0.72, 0.72, 0.60], 2000, 9), b)
    assert c.delta == pytest.approx(-0.02)
    assert c.flips == 6
    assert c.claim == "no claim"  # all-{0, 1} seed resamples (p = 8/27) give delta* > 0
    # delta = mean(0.80, 0.80, 0.68) - 0.70 = +0.06: only (seed 2 of A, each B seed) disagree -> 3 flips
    c = compare(system([0.80, 0.80, 0.68], 2000, 11), b)
    assert c.delta == pytest.approx(0.06)
    assert c.flips == 3
    assert c.claim != "B > A"


def test_paired_items_narrow_the_comparison():
    rng = np.random.default_rng(12)
    n = 2000
    base = (rng.random(n) < 0.7).astype(float)
    worse = base.copy()
    worse[np.flatnonzero(base)[:100]] = 0.0  # B loses 100 of A's correct items, same item set
    a, b = (np.stack([np.stack([x, x, 1 - x, 1 - x], axis=1)] * 2) for x in (base, worse))
    c = compare(a, b)
    ia, ib = multi_bootstrap(a), multi_bootstrap(b)
    assert c.delta == pytest.approx(100 / n)
    assert width(c) < 2 / 3 * (width(ia) / 2 + width(ib) / 2)
    assert c.claim == "A > B"


def test_compare_rejects_different_item_sets():
    with pytest.raises(ValueError, match=r"\(2, 10, 4\).*\(2, 11, 4\)"):
        compare(np.zeros((2, 10, 4)), np.zeros((2, 11, 4)))


def layered(ps_per_layer, n: int, n_seeds: int, seed: int) -> np.ndarray:
    """(S, L, n, 4) cumulative-style items: layer l's correct items contain layer l-1's (nested)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_seeds):
        order = rng.permutation(n)
        layers = []
        for p in ps_per_layer:
            c = np.zeros(n)
            c[order[: round(p * n)]] = 1.0
            layers.append(np.stack([c, c, 1 - c, 1 - c], axis=1))
        out.append(np.stack(layers))
    return np.stack(out)


def test_expected_layer_delta_all_gain_at_layer_two():
    x = layered([0.5, 0.5, 0.9, 0.9], 1000, 3, 13)
    iv = expected_layer_delta(x, n_boot=300)
    assert center_of_gravity(differential_scores([0.5, 0.5, 0.9, 0.9])) == 2.0
    assert iv.value == pytest.approx(2.0)
    assert iv.low <= 2.0 <= iv.high and width(iv) < 0.2


def test_expected_layer_delta_spread_gain_and_layer_ids():
    x = layered([0.5, 0.7, 0.9], 1000, 2, 14)
    iv = expected_layer_delta(x, n_boot=300)
    assert iv.value == pytest.approx(1.5)  # (1 * 0.2 + 2 * 0.2) / 0.4
    assert iv.low < 1.5 < iv.high
    assert expected_layer_delta(x, layer_ids=[0, 2, 4], n_boot=50).value == pytest.approx(3.0)


def test_expected_layer_delta_flat_curve_is_nan():
    iv = expected_layer_delta(layered([0.6, 0.6, 0.6], 200, 2, 15), n_boot=50)
    assert np.isnan(iv.value) and np.isnan(iv.low) and np.isnan(iv.high)


def test_layer_curve_and_best_layer_share_resamples():
    x = layered([0.5, 0.8, 0.7], 1500, 3, 16)
    x[:, 2] = layered([0.7], 1500, 3, 17)[:, 0]  # layer 2 not nested: its own items
    curve = layer_curve(x, n_boot=400)
    best = best_layer_score(x, n_boot=400)
    assert [iv.value for iv in curve] == pytest.approx([0.5, 0.8, 0.7])
    for iv in curve:
        assert iv.low <= iv.value <= iv.high
    assert best.value == pytest.approx(max(iv.value for iv in curve))
    assert best.low >= max(iv.low for iv in curve) and best.high >= max(iv.high for iv in curve)
    # layer 1 beats layer 0 on every item: with shared resamples the max never picks layer 0
    two = layered([0.5, 0.52], 1500, 3, 18)
    assert best_layer_score(two, n_boot=400) == layer_curve(two, n_boot=400)[1]


def test_seeds_only_edge_cases_and_compare_seeds_only():
    one = seeds_only([0.4])
    assert one.value == 0.4 and np.isnan(one.low) and np.isnan(one.high) and one.n_items == 0
    two = compare_seeds_only([10.0, 10.0], [5.0, 5.0])  # two equal seeds a side: a zero-width interval
    assert two.low == two.high == 5.0 and two.claim == "no claim"  # but fewer than 3 seeds: no claim
    c = compare_seeds_only([10.0, 11.0, 12.0], [5.0, 6.0, 5.5])
    assert c.claim == "A > B" and c.flips == 0 and c.p_a_gt_b == 1.0 and c.n_seed_pairs == 9
    c = compare_seeds_only([10.0, 11.0, 4.0], [5.0, 6.0])  # delta > 0; seed 2 of A loses to both B seeds
    assert c.delta == pytest.approx(25 / 3 - 5.5) and c.flips == 2
    c = compare_seeds_only([1.0], [0.0, 2.0])  # delta = 0: every pair with a non-zero difference differs
    assert c.claim == "no claim" and np.isnan(c.low) and np.isnan(c.p_a_gt_b) and c.flips == 2


def test_same_seed_same_intervals():
    x = system([0.6, 0.7, 0.8], 500, 19)
    assert multi_bootstrap(x, seed=3) == multi_bootstrap(x, seed=3)
    assert multi_bootstrap(x, seed=3) != multi_bootstrap(x, seed=4)
    assert compare(x, x[::-1], seed=5) == compare(x, x[::-1], seed=5)
    assert seeds_only([1.0, 2.0, 4.0], seed=1) == seeds_only([1.0, 2.0, 4.0], seed=1)
    assert isinstance(multi_bootstrap(x, n_boot=10), Interval)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown metric 'f2'"):
        multi_bootstrap(np.zeros((2, 10, 4)), "f2")
    with pytest.raises(ValueError, match=r"\(S seeds, N items, 4 columns\).*\(10, 4\)"):
        multi_bootstrap(np.zeros((10, 4)))
    with pytest.raises(ValueError, match=r"\(2, 10, 3\)"):
        multi_bootstrap(np.zeros((2, 10, 3)))
    with pytest.raises(ValueError, match=r"L layers.*\(2, 10, 4\)"):
        layer_curve(np.zeros((2, 10, 4)))
    with pytest.raises(ValueError, match="3 layer_ids for 2 layers"):
        expected_layer_delta(np.zeros((1, 2, 5, 4)), layer_ids=[0, 1, 2])
    with pytest.raises(ValueError, match=r"shape \(N, 4\)"):
        score(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="level"):
        seeds_only([1.0, 2.0], level=1.5)
    with pytest.raises(ValueError, match="finite"):
        seeds_only([1.0, float("nan")])
