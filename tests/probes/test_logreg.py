"""LogisticRegressionLBFGS: scikit-learn's multinomial lbfgs objective, fitted in torch."""
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from probes.logreg import LogisticRegressionLBFGS


def _blobs(n=600, d=12, k=4, seed=0, noise=1.5):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)) * 2
    y = rng.integers(0, k, n)
    return (centers[y] + noise * rng.normal(size=(n, d))).astype(np.float64), y


@pytest.mark.parametrize("C", [0.05, 1.0])
def test_converged_fit_matches_sklearn(C):
    # Both solvers converge on this small convex problem, so they must reach the same optimum.
    X, y = _blobs()
    ref = LogisticRegression(C=C, max_iter=5000, tol=1e-10).fit(X, y)
    est = LogisticRegressionLBFGS(C=C, max_iter=5000, tol=1e-10, dtype=torch.float64).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=2e-5)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, atol=2e-5)
    np.testing.assert_allclose(est.predict_proba(X), ref.predict_proba(X), atol=1e-6)
    assert (est.predict(X) == ref.predict(X)).all()
    assert est.n_iter_ > 1


def test_penalty_shrinks_weights_and_labels_keep_their_names():
    X, y = _blobs(seed=1)
    names = np.array(["DET", "NOUN", "VERB", "ADP"])[y]
    weak = LogisticRegressionLBFGS(C=100.0).fit(X, names)
    strong = LogisticRegressionLBFGS(C=1e-3).fit(X, names)
    assert np.abs(strong.coef_).sum() < 0.2 * np.abs(weak.coef_).sum()
    assert set(weak.predict(X)) <= set(names) and list(weak.classes_) == sorted(set(names))


def test_planted_linear_rule_is_recovered_on_held_out_rows():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(3000, 20)).astype(np.float32)
    y = np.argmax(X[:, :3] @ np.array([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0]]), axis=1)
    est = LogisticRegressionLBFGS().fit(X[:2000], y[:2000])
    assert est.score(X[2000:], y[2000:]) > 0.95
    # weights on the 17 noise features stay small against the 3 that carry the rule
    assert np.abs(est.coef_[:, 3:]).max() < 0.3 * np.abs(est.coef_[:, :3]).max()


def test_bad_input_names_the_problem():
    X, y = _blobs(n=50)
    with pytest.raises(ValueError, match="one label per row"):
        LogisticRegressionLBFGS().fit(X, y[:-1])
    with pytest.raises(ValueError, match="at least 2 classes"):
        LogisticRegressionLBFGS().fit(X, np.zeros(50))
    with pytest.raises(ValueError, match="non-finite"):
        LogisticRegressionLBFGS().fit(np.where(np.eye(50, 12) > 0, np.nan, X), y)
    with pytest.raises(RuntimeError, match="not fitted"):
        LogisticRegressionLBFGS().predict(X)
    with pytest.raises(ValueError, match="features"):
        LogisticRegressionLBFGS().fit(X, y).predict(X[:, :5])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_fit_matches_cpu_fit():
    X, y = _blobs()
    cpu = LogisticRegressionLBFGS(max_iter=2000, tol=1e-8, dtype=torch.float64).fit(X, y)
    gpu = LogisticRegressionLBFGS(max_iter=2000, tol=1e-8, dtype=torch.float64, device="cuda").fit(X, y)
    np.testing.assert_allclose(gpu.coef_, cpu.coef_, atol=1e-5)
