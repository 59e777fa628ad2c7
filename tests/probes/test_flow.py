"""probes.flow: the Voita et al. MI estimator on planted data, and its probe-based companion."""
import numpy as np
import pytest

from probes.flow import KMeansMI, ProbeMI, discrete_mi, entropy_bits, shuffled_control


def planted(seed: int = 0, n: int = 1500, v: int = 8, d: int = 16):
    """(copy layer, noise layer, tokens, groups): the copy layer is the token's own random vector plus
    small noise; the noise layer knows nothing about the token."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, v, n)
    emb = rng.normal(size=(v, d)) * 3.0
    copy = emb[y] + 0.05 * rng.normal(size=(n, d))
    noise = rng.normal(size=(n, d))
    return copy.astype(np.float32), noise.astype(np.float32), y, np.arange(n) // 10


def test_discrete_mi_by_hand():
    # a = b on two equiprobable values: 1 bit; independent halves: 0 bits
    assert discrete_mi(np.array([0, 0, 1, 1]), np.array([5, 5, 7, 7])) == pytest.approx(1.0)
    assert discrete_mi(np.array([0, 1, 0, 1]), np.array([5, 5, 7, 7])) == pytest.approx(0.0)
    # p(a, b) = [[1/2, 0], [1/4, 1/4]]: I = H(b) - H(b | a) = h(1/4) - 1/2 h(1/2) with h the binary entropy
    h = lambda p: -p * np.log2(p) - (1 - p) * np.log2(1 - p)
    assert discrete_mi(np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1])) == pytest.approx(h(0.25) - 0.5)
    assert entropy_bits(np.arange(8)) == pytest.approx(3.0)


def test_kmeans_mi_copy_layer_is_maximal_and_noise_is_near_zero():
    copy, noise, y, groups = planted()
    est = KMeansMI(n_clusters=8, n_boot=50).fit(copy, y, groups)
    assert est.mi_ == pytest.approx(est.entropy_, abs=0.01)  # every token its own cluster: I = H(Y)
    assert est.ci_[0] <= est.mi_ <= est.ci_[1]
    floor = KMeansMI(n_clusters=8, n_boot=50).fit(noise, y, groups)
    assert floor.mi_ < 0.03 * floor.entropy_  # plug-in bias only: ~ (K-1)(V-1)/(2 N ln 2) = 0.024 bits
    # resampled duplicates inflate the plug-in MI: the interval is recentred, so it holds the estimate
    assert floor.ci_[0] <= floor.mi_ <= floor.ci_[1]


def test_shuffled_control_removes_the_copy_layers_information():
    copy, _, y, groups = planted()
    ctrl = shuffled_control(KMeansMI(n_clusters=8, n_boot=20), copy, y, groups)
    assert ctrl.mi_ < 0.03 * ctrl.entropy_


def test_probe_mi_lower_bound_copy_vs_noise():
    copy, noise, y, groups = planted()
    high = ProbeMI(n_boot=50).fit(copy, y, groups)
    low = ProbeMI(n_boot=50).fit(noise, y, groups)
    assert high.mi_ > 0.9 * high.entropy_
    assert low.mi_ < 0.05  # a lower bound: at or below 0 when the layer knows nothing
    assert high.ci_[0] <= high.mi_ <= high.ci_[1]


def test_bad_shapes_name_the_estimator():
    with pytest.raises(ValueError, match="KMeansMI.fit"):
        KMeansMI().fit(np.zeros((4, 2)), np.zeros(3))


@pytest.mark.parametrize("make", [lambda: KMeansMI(n_clusters=8, n_boot=20), lambda: ProbeMI(n_boot=20)])
def test_fit_shuffled_equals_the_shuffled_control(make):
    copy, _, y, groups = planted(n=600)
    fitted = make().fit(copy, y, groups)
    fast = fitted.fit_shuffled(copy, y, groups, seed=3)
    slow = shuffled_control(make(), copy, y, groups, seed=3)
    assert fast.mi_ == pytest.approx(slow.mi_, abs=1e-12)
    np.testing.assert_allclose(fast.ci_, slow.ci_, atol=1e-12)
    assert fitted.mi_ > 0.9 * fitted.entropy_ and fast.mi_ < 0.1 * fast.entropy_  # the fitted one is untouched


def test_fit_shuffled_needs_the_same_rows():
    copy, _, y, groups = planted(n=600)
    with pytest.raises(ValueError, match="KMeansMI.fit_shuffled"):
        KMeansMI(n_clusters=8, n_boot=5).fit(copy[:300], y[:300], groups[:300]).fit_shuffled(copy, y, groups)
