"""CKA (Kornblith et al. 2019), debiased HSIC (Song et al. 2012) and minibatch CKA (Nguyen et al. 2021)."""

import numpy as np
import pytest

from probes.cka import (MinibatchCKA, cka_frame, cka_from_grams, cka_matrix, gram_linear, gram_rbf,
                        hsic_unbiased, linear_cka, rbf_cka)


@pytest.fixture
def XY():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 8)) + 2.0
    Y = np.tanh(X @ rng.normal(size=(8, 6))) + 0.5 * rng.normal(size=(60, 6))
    return X, Y


def random_orthogonal(d, seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def test_self_similarity_is_one(XY):
    X, _ = XY
    assert linear_cka(X, X) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(X, X, debiased=True) == pytest.approx(1.0, abs=1e-12)
    assert rbf_cka(X, X) == pytest.approx(1.0, abs=1e-12)


def test_invariant_to_orthogonal_maps_and_isotropic_scaling(XY):
    X, Y = XY
    Q = random_orthogonal(X.shape[1], 1)
    ref = linear_cka(X, Y)
    assert linear_cka(X @ Q * 3.7, Y) == pytest.approx(ref, rel=1e-10)
    assert linear_cka(X, 0.01 * Y + 5.0) == pytest.approx(ref, rel=1e-10)   # translation too (centering)
    assert linear_cka(X @ Q, Y, debiased=True) == pytest.approx(linear_cka(X, Y, debiased=True), rel=1e-10)
    assert rbf_cka(X @ Q * 3.7, Y) == pytest.approx(rbf_cka(X, Y), rel=1e-10)  # median bandwidth scales too


def test_not_invariant_to_arbitrary_invertible_maps(XY):
    X, _ = XY
    A = random_orthogonal(8, 2) @ np.diag(np.geomspace(10, 0.1, 8)) @ random_orthogonal(8, 3)
    assert np.linalg.matrix_rank(A) == 8
    assert linear_cka(X, X @ A) < 0.9


def test_matches_hand_computation_from_hsic_formula():
    X = np.array([[1.0, 0.0], [2.0, 1.0], [0.0, 3.0], [4.0, 1.0], [1.0, 1.0]])
    Y = np.array([[0.5, 1.0, 0.0], [1.0, 0.0, 2.0], [3.0, 1.0, 1.0], [0.0, 2.0, 1.0], [2.0, 2.0, 0.0]])
    n = 5
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T
    hsic = lambda A, B: np.trace(A @ H @ B @ H) / (n - 1) ** 2
    expected = hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))
    assert linear_cka(X, Y) == pytest.approx(expected, rel=1e-12)
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    feature_form = np.linalg.norm(Yc.T @ Xc) ** 2 / (np.linalg.norm(Xc.T @ Xc) * np.linalg.norm(Yc.T @ Yc))
    assert expected == pytest.approx(feature_form, rel=1e-12)

    # Song et al. 2012 eq. 5, written out with explicit sums
    def hsic1(A, B):
        A, B = A - np.diag(np.diag(A)), B - np.diag(np.diag(B))
        one = np.ones(n)
        return (np.trace(A @ B) + (one @ A @ one) * (one @ B @ one) / ((n - 1) * (n - 2))
                - 2 / (n - 2) * one @ A @ B @ one) / (n * (n - 3))
    assert hsic_unbiased(K, L) == pytest.approx(hsic1(K, L), rel=1e-12)
    deb = hsic1(K, L) / np.sqrt(hsic1(K, K) * hsic1(L, L))
    assert linear_cka(X, Y, debiased=True) == pytest.approx(deb, rel=1e-10)


def test_rbf_bandwidth_is_fraction_of_median_distance():
    X = np.array([[0.0], [1.0], [3.0]])
    d2 = np.array([[0, 1, 9], [1, 0, 4], [9, 4, 0]], float)   # median of all 9 entries = 1
    assert np.allclose(gram_rbf(X, 0.5), np.exp(-d2 / (2 * 0.25 * 1.0)))


def test_debiased_and_minibatch_estimates_approach_the_full_one():
    rng = np.random.default_rng(5)
    n = 4000
    X = rng.normal(size=(n, 10))
    Y = X[:, :6] @ rng.normal(size=(6, 12)) + rng.normal(size=(n, 12))
    full = linear_cka(X, Y)
    assert linear_cka(X, Y, debiased=True) == pytest.approx(full, abs=0.01)
    mb = MinibatchCKA()
    for b in range(0, n, 400):
        mb.update([X[b:b + 400]], [Y[b:b + 400]])
    assert mb.n_batches_ == 10
    assert mb.finalize()[0, 0] == pytest.approx(full, abs=0.02)
    # the minibatch estimator is the debiased one: on one batch it equals debiased CKA exactly
    one = MinibatchCKA().update([X[:300]], [Y[:300]]).finalize()[0, 0]
    assert one == pytest.approx(cka_from_grams(gram_linear(X[:300]), gram_linear(Y[:300]), debiased=True), rel=1e-10)


def layer_stack(rng, n, d, L):
    x, out = rng.normal(size=(n, d)), []
    for _ in range(L):
        x = np.tanh(x @ rng.normal(size=(d, d)) / np.sqrt(d) * 1.5 + 0.3 * x)
        out.append(x)
    return out


def test_perturbed_seeds_peak_on_the_diagonal_and_match_pairwise_cka():
    rng = np.random.default_rng(7)
    A = layer_stack(rng, 300, 16, 5)
    B = [a + 0.15 * rng.normal(size=a.shape) for a in A]
    M = cka_matrix(A, B)
    assert M.shape == (5, 5)
    assert (M.argmax(1) == np.arange(5)).all() and (M.argmax(0) == np.arange(5)).all()
    assert M[1, 3] == pytest.approx(linear_cka(A[1], B[3]), rel=1e-10)
    Md = cka_matrix(A, B, debiased=True)
    assert Md[2, 0] == pytest.approx(linear_cka(A[2], B[0], debiased=True), rel=1e-10)
    S = cka_matrix(A)
    assert np.allclose(S, S.T) and np.allclose(np.diag(S), 1.0)
    R = cka_matrix(A[:2], B[:3], kind="rbf", sigma_frac=0.8)
    assert R[1, 2] == pytest.approx(rbf_cka(A[1], B[2], sigma_frac=0.8), rel=1e-10)
    MB = MinibatchCKA()
    for b in range(0, 300, 100):
        MB.update([a[b:b + 100] for a in A], [x[b:b + 100] for x in B])
    assert (MB.finalize().argmax(1) == np.arange(5)).all()


def test_float32_path_for_large_stacks_matches_float64():
    rng = np.random.default_rng(8)
    A = [rng.normal(size=(6000, 256)).astype(np.float32) for _ in range(3)]
    A[1] = A[0] + A[1]
    M = cka_matrix(A)   # 6000 x 768 > 2^22 elements: float32 GEMMs
    assert M[0, 1] == pytest.approx(_ref(A[0], A[1]), rel=1e-5)


def _ref(X, Y):
    Xc, Yc = X - X.mean(0, dtype=np.float64), Y - Y.mean(0, dtype=np.float64)
    return np.linalg.norm(Yc.T @ Xc) ** 2 / (np.linalg.norm(Xc.T @ Xc) * np.linalg.norm(Yc.T @ Yc))


def test_frame_schema_and_bad_input():
    df = cka_frame(np.array([[1.0, 0.5], [0.5, 1.0], [0.2, 0.3]]), "a", "b")
    assert list(df.columns) == ["model_a", "model_b", "layer_a", "layer_b", "kind", "value"]
    assert df.query("layer_a == 2 and layer_b == 1").value.item() == 0.3
    with pytest.raises(ValueError, match="same number of examples"):
        linear_cka(np.ones((5, 2)), np.ones((6, 2)))
    with pytest.raises(ValueError, match="unknown CKA kind"):
        cka_matrix([np.ones((5, 2))], kind="cosine")
    with pytest.raises(ValueError, match="more than 3"):
        MinibatchCKA().update([np.ones((3, 2))])
