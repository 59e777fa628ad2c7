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
    compare_e_delta,
    compare_seeds_only,
    expected_layer_delta,
    held_out_best,
    holm,
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


@pytest.mark.parametrize("tp,fp,fn,f1", [(0, 1, 0, 0.0), (0, 0, 1, 0.0), (1, 0, 0, 1.0), (0, 2, 0, 0.0),
                                         (1, 1, 0, 2 / 3), (1, 1, 1, 0.5), (0, 0, 0, 1.0)])
def test_vectorised_micro_f1_equals_the_counts_formula_on_small_counts(tp, fp, fn, f1):
    """By hand, 2 tp / (2 tp + fp + fn), 1.0 with no entity at all: a single false positive or false
    negative (denominator 1) scores 0, not the empty case's 1."""
    sums = np.array([0.0, tp, fp, fn])
    assert _micro_f1_from_sums(sums, 1) == pytest.approx(f1)
    assert micro_f1_from_counts(np.array([[tp, fp, fn]], dtype=float)) == pytest.approx(f1)


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
    a, b = (np.stack([np.stack([x, x, 1 - x, 1 - x], axis=1)] * 3) for x in (base, worse))
    c = compare(a, b)
    ia, ib = multi_bootstrap(a), multi_bootstrap(b)
    assert c.delta == pytest.approx(100 / n)
    assert width(c) < 2 / 3 * (width(ia) / 2 + width(ib) / 2)
    assert c.claim == "A > B"


def test_compare_resamples_each_systems_seeds_independently():
    """Seed s of A has nothing to do with seed s of B: each replicate draws A's seeds and B's seeds apart.
    A's seeds score 0.6, 0.7, 0.8 and B's 0.05 less each, on their own items. Drawn apart, delta* has the
    variance of two seed means, 2 x (plug-in variance 0.02 / 3) / 3, plus the items': a 95% interval about
    0.26 wide. One draw shared by A and B would pair seed k of A with seed k of B, whose difference is
    0.05 for every k, and leave only the items' width (about 0.04): issue 75's mutation."""
    n = 3000
    a, b = system([0.6, 0.7, 0.8], n, 30), system([0.55, 0.65, 0.75], n, 31)
    c = compare(a, b, n_boot=4000, seed=1)
    seeds_var = 2 * (np.var([0.6, 0.7, 0.8]) / 3)
    items_var = (0.7 * 0.3 + 0.65 * 0.35) / n     # two independent item sets, each seed mean over 3 seeds
    assert width(c) == pytest.approx(2 * 1.96 * np.sqrt(seeds_var + items_var / 3), rel=0.15)
    assert width(c) > 4 * width(multi_bootstrap(a, resample_seeds=False, n_boot=2000))
    assert c.claim == "no claim" and c.n_seeds == 3


def test_fewer_than_three_seeds_a_system_make_no_claim():
    """A bootstrap of the mean of S seeds has (S - 1) / S of the unbiased seed variance: at two seeds, half.
    A planted gap of 0.1 on 3,000 items with two seeds a side: the interval excludes 0, the p-value is
    small, but no claim; the same systems with a third seed: the claim."""
    a, b = system([0.80, 0.81], 3000, 32), system([0.70, 0.71], 3000, 33)
    c = compare(a, b)
    assert c.low > 0 and c.p_value < 1e-6 and c.n_seeds == 2
    assert c.claim == "no claim"
    a3, b3 = system([0.80, 0.81, 0.80], 3000, 32), system([0.70, 0.71, 0.70], 3000, 33)
    assert compare(a3, b3).claim == "A > B" and compare(a3, b3).n_seeds == 3
    assert compare(a3, b).claim == "no claim"                      # the smaller system decides
    assert compare_seeds_only([5.0, 6.0], [1.0, 1.5]).claim == "no claim"
    assert compare_seeds_only([5.0, 6.0, 5.5], [1.0, 1.5, 1.2]).claim == "A > B"


def test_p_value_is_the_wald_p_of_the_replicates():
    """p = 2 Phi(-|delta| / sd(delta*)): on per-seed scalars with a fixed seed, recomputed from the same
    replicates by hand; p < 0.05 exactly where a normal-ish interval excludes 0."""
    from scipy.stats import norm
    a, b = [1.0, 2.0, 1.5, 1.8], [0.9, 1.1, 1.6, 1.2]
    c = compare_seeds_only(a, b, n_boot=3000, seed=7)
    rng = np.random.default_rng(7)
    va, vb = np.asarray(a), np.asarray(b)
    boots = va[rng.integers(0, 4, (3000, 4))].mean(1) - vb[rng.integers(0, 4, (3000, 4))].mean(1)
    assert c.p_value == pytest.approx(2 * norm.sf(abs(c.delta) / boots.std(ddof=1)))
    assert (c.p_value < 0.05) == (c.claim != "no claim")


def test_held_out_best_does_not_reward_noise():
    """Twelve layers of the same planted accuracy 0.5: the in-sample maximum over layers reads above 0.5
    (the best of twelve noisy scores), the layer chosen on one half and scored on the other does not.
    A real best layer (0.8 among 0.5s) is found and scored at its level."""
    rng = np.random.default_rng(34)
    in_sample, held_out = [], []
    for _ in range(30):
        x = (rng.random((3, 12, 400, 1)) < 0.5).astype(float)
        x = np.concatenate([x, x, 1 - x, 1 - x], axis=3)
        in_sample.append(best_layer_score(x, n_boot=1).value)
        held_out.append(held_out_best(x)[1].mean(axis=1)[:, 0].mean())
    assert np.mean(in_sample) > 0.5 + 0.02
    assert np.mean(held_out) == pytest.approx(0.5, abs=0.006)
    x = layered([0.5, 0.5, 0.5, 0.5], 1000, 3, 35)
    x[:, 2] = layered([0.8], 1000, 3, 36)[:, 0]
    layer, chosen = held_out_best(x)
    assert layer == 2 and chosen.shape == (3, 1000, 4)
    assert multi_bootstrap(chosen, n_boot=50).value == pytest.approx(0.8, abs=0.03)


def test_held_out_best_scores_each_half_at_the_other_halfs_choice():
    """Layer 0 is best on the first half of the items, layer 1 on the second: each half is scored at the
    layer the other half chose (the worse one for it), and the halves disagree: layer -1."""
    n = 100
    first = np.r_[np.ones(n // 2), np.zeros(n // 2)]
    x = np.stack([first, 1 - first])[None, :, :, None] * np.array([1, 1, 0, 0]) \
        + np.stack([1 - first, first])[None, :, :, None] * np.array([0, 0, 1, 1])   # (1, 2, N, 4)
    layer, chosen = held_out_best(x)
    assert layer == -1
    assert score(chosen[0]) == 0.0          # every item scored at the layer the other half chose
    with pytest.raises(ValueError, match="at least 2 test items"):
        held_out_best(np.zeros((1, 2, 1, 4)))


def test_holm_by_hand():
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    # sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max(0.06, 0.04) = 0.06
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02, np.nan])
    np.testing.assert_allclose(holm([0.3, 0.02]), [0.3, 0.04])
    assert holm([0.9, 0.8]).tolist() == [1.0, 1.0] and holm([]).size == 0


def test_holm_keeps_false_claims_in_a_family_of_planted_nulls():
    """100 families of 15 comparisons of two systems drawn from the same procedure (4 seeds with a seed
    effect, shared item difficulty, 150 items): each comparison's p < 0.05 about 5% of the time, so
    claiming every p < 0.05 makes a false claim in about half of the families (1 - 0.95^15 = 0.54); Holm's
    adjusted p < 0.05 in about 5% of them. On exactly uniform null p-values Holm's share of families
    with a false claim is 1 - (1 - 0.05 / 20)^20 = 0.049 (its bound is tight for independent tests)."""
    rng = np.random.default_rng(37)

    def sample(u, base):
        shift = rng.normal(0, 0.03, 4)
        uu = np.where(rng.random((4, u.size)) < 0.1, rng.random((4, u.size)), u[None])
        c = (uu < base + shift[:, None]).astype(float)
        return np.stack([c, c, 1 - c, 1 - c], axis=2)

    ps = np.array([[compare(sample(u, base), sample(u, base), n_boot=200, seed=f * 15 + k).p_value
                    for k, (base, u) in enumerate((rng.uniform(0.5, 0.8), rng.random(150)) for _ in range(15))]
                   for f in range(100)])                                        # (families, comparisons)
    assert (ps < 0.05).mean() == pytest.approx(0.05, abs=0.025)
    assert (ps.min(axis=1) < 0.05).mean() > 0.35
    assert (np.apply_along_axis(holm, 1, ps).min(axis=1) < 0.05).mean() <= 0.08
    uniform = rng.random((4000, 20))
    share = (np.apply_along_axis(holm, 1, uniform).min(axis=1) < 0.05).mean()
    assert share == pytest.approx(1 - (1 - 0.05 / 20) ** 20, abs=0.012)


def test_compare_e_delta_planted_centres():
    """A gains everything at layer 2, B at layer 1: E_delta 2 and 1, delta 1 with three seeds a side."""
    a = layered([0.5, 0.5, 0.9, 0.9], 1000, 3, 38)
    b = layered([0.5, 0.9, 0.9, 0.9], 1000, 3, 39)
    c = compare_e_delta(a, b, n_boot=200)
    assert c.delta == pytest.approx(1.0) and c.claim == "A > B" and c.low > 0.5
    c = compare_e_delta(a, b[:, :3], layer_ids_b=[0, 2, 4], n_boot=50)
    assert c.delta == pytest.approx(0.0)     # B's gain at its second layer, named layer 2
    with pytest.raises(ValueError, match="2 layer_ids_b for 3 layers"):
        compare_e_delta(a, b[:, :3], layer_ids_b=[0, 1])


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


def test_an_undefined_e_delta_counts_no_seed_pair_flips():
    """A's probes get worse with depth (sum of d_l < 0): its E_delta, and so delta, is undefined (nan),
    and no seed pair can disagree with an undefined sign."""
    a = layered([0.6, 0.5], 200, 3, 1)
    b = layered([0.5, 0.7], 200, 3, 2)
    c = compare_e_delta(a, b, n_boot=50)
    assert np.isnan(c.delta) and c.claim == "no claim"
    assert c.flips == 0 and c.n_seed_pairs == 9
