"""Removing a property from a layer's vectors, for amnesic probing (Elazar, Ravfogel, Jacovi &
Goldberg 2021, "Amnesic Probing: Behavioral Explanation with Amnesic Counterfactuals"): erase what a
linear probe reads of the property, put the erased vectors back into the model, and see what the
model loses. Three erasers, shaped like scikit-learn transformers (`fit(X, y)`, `transform(X)`):

- `LeaceEraser` (Belrose, Schneider-Joseph, Ravfogel, Cotterell, Raff & Biderman 2023, "LEACE:
  Perfect linear concept erasure in closed form"; following EleutherAI/concept-erasure's
  `LeaceFitter`). With one-hot labels Z, mean mu, covariance S = Cov(X), cross-covariance
  C = Cov(X, Z) (D, K), whitening W = S^{-1/2} (pseudo-inverse square root over eigenvalues above
  `tol` x the largest) and P_U the orthogonal projection on the column space of W C,

      r(x) = x - W^+ P_U W (x - mu).

  After it, Cov(r(X), Z) = 0: no linear classifier does better than a constant (the paper's
  Theorem 3.1), and among the affine erasers with that property it moves x the least in the
  whitened norm. Rank: at most K - 1.
- `INLPEraser` (Ravfogel, Elazar, Gonen, Twiton & Goldberg 2020, "Null It Out: Guarding Protected
  Attributes by Iterative Nullspace Projection"; following shauli-ravfogel/nullspace_projection):
  `n_iter` times, fit a linear classifier on the projected vectors and add the row space of its
  weights to the removed space; P = I - the projection on the span of every removed direction
  (`get_projection_to_intersection_of_nullspaces`), x -> P x. Stops early when the classifier's
  held-out accuracy falls to `min_accuracy` (default: the majority class's share + 0.01). The
  classifier is `probes.logreg.LogisticRegressionLBFGS` (the reference uses scikit-learn's SGD or
  LinearSVC); a multiclass classifier removes K directions per iteration, as the reference does.
- `RandomEraser`: the control of the same rank (Elazar et al.: a projection removing as many random
  directions), x -> x - Q Q^T (x - mu) with Q random orthonormal (D, r).

All work in float64 internally and return float32 (the store's precision).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from probes.estimator import OneLayerEstimator
from probes.logreg import LogisticRegressionLBFGS


def _onehot(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    classes, idx = np.unique(np.asarray(y), return_inverse=True)
    z = np.zeros((len(idx), len(classes)))
    z[np.arange(len(idx)), idx] = 1.0
    return z, classes


def _check_xy(X: np.ndarray, y: Any) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != len(X):
        raise ValueError(f"y: need one label per row of X ({len(X)}), got shape {y.shape}")
    if len(np.unique(y)) < 2:
        raise ValueError("y: need at least two classes to erase a property")
    return X, y


class _Eraser(OneLayerEstimator):
    """transform(X) = X - (X - mean_) @ right_.T @ left_.T (float32); `rank_` directions removed."""

    def transform(self, X: Any) -> np.ndarray:
        X = np.asarray(self._layer(X), dtype=np.float64)
        return (X - (X - self.mean_) @ self.right_.T @ self.left_.T).astype(np.float32)

    def fit_transform(self, X: Any, y: Any) -> np.ndarray:
        return self.fit(X, y).transform(X)

    @property
    def linear_map(self) -> np.ndarray:
        """(D, D) matrix A with transform(x) = A x + (I - A) mean_: what a hook applies."""
        return np.eye(self.d_in_) - self.left_ @ self.right_


class LeaceEraser(_Eraser):
    """LEACE: the least-squares affine eraser after which no linear probe beats a constant."""

    _PARAMS = ("tol",)

    def __init__(self, tol: float = 1e-6) -> None:
        self.tol = tol

    def fit(self, X: Any, y: Any) -> LeaceEraser:
        X, y = _check_xy(np.asarray(self._layer(X), dtype=np.float64), y)
        z, self.classes_ = _onehot(y)
        self.d_in_ = X.shape[1]
        self.mean_ = X.mean(0)
        xc = X - self.mean_
        cov = xc.T @ xc / len(X)  # (D, D)
        cross = xc.T @ (z - z.mean(0)) / len(X)  # (D, K)
        evals, evecs = np.linalg.eigh(cov)
        keep = evals > self.tol * max(float(evals.max()), 1e-300)
        root = np.sqrt(np.where(keep, evals, 1.0))
        w = (evecs * np.where(keep, 1.0 / root, 0.0)) @ evecs.T  # S^{-1/2} (pseudo-inverse on the kept part)
        w_inv = (evecs * np.where(keep, root, 0.0)) @ evecs.T  # S^{1/2}
        u, s, _ = np.linalg.svd(w @ cross, full_matrices=False)  # (D, K)
        u = u[:, s > self.tol * max(float(s.max()), 1e-300)] if s.size else u[:, :0]
        self.rank_ = u.shape[1]
        self.left_, self.right_ = w_inv @ u, u.T @ w  # (D, r), (r, D)
        return self


class RandomEraser(_Eraser):
    """The control: remove `rank` random orthonormal directions around the mean."""

    _PARAMS = ("rank", "seed")

    def __init__(self, rank: int = 1, seed: int = 0) -> None:
        self.rank, self.seed = rank, seed

    def fit(self, X: Any, y: Any = None) -> RandomEraser:
        X = np.asarray(self._layer(X), dtype=np.float64)
        self.d_in_ = X.shape[1]
        if not 0 <= self.rank <= self.d_in_:
            raise ValueError(f"RandomEraser: rank {self.rank} not in [0, {self.d_in_}]")
        q, _ = np.linalg.qr(np.random.default_rng(self.seed).standard_normal((self.d_in_, max(self.rank, 1))))
        q = q[:, : self.rank]
        self.mean_, self.left_, self.right_, self.rank_ = X.mean(0), q, q.T, self.rank
        return self


def _orth(rows: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """(r, D) orthonormal basis of the row space of `rows`."""
    if rows.size == 0:
        return rows
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    return vt[s > tol * max(float(s.max()), 1e-300)]


class INLPEraser(_Eraser):
    """INLP: remove, iteration by iteration, the directions a linear classifier uses."""

    _PARAMS = ("n_iter", "min_accuracy", "C", "seed", "max_iter")

    def __init__(self, n_iter: int = 20, min_accuracy: float | None = None, C: float = 1.0, seed: int = 0,
                 max_iter: int = 200) -> None:
        self.n_iter, self.min_accuracy, self.C, self.seed, self.max_iter = n_iter, min_accuracy, C, seed, max_iter

    def fit(self, X: Any, y: Any, X_dev: Any = None, y_dev: Any = None) -> INLPEraser:
        X, y = _check_xy(np.asarray(self._layer(X), dtype=np.float64), y)
        self.d_in_ = X.shape[1]
        if X_dev is None:
            X_dev, y_dev = X, y
        X_dev = np.asarray(self._layer(X_dev), dtype=np.float64)
        y_dev = np.asarray(y_dev)
        floor = self.min_accuracy
        if floor is None:
            floor = float(np.max(np.unique(y_dev, return_counts=True)[1]) / len(y_dev)) + 0.01
        basis = np.zeros((0, self.d_in_))
        self.accuracies_: list[float] = []
        for i in range(self.n_iter):
            p = np.eye(self.d_in_) - basis.T @ basis
            clf = LogisticRegressionLBFGS(C=self.C, max_iter=self.max_iter)
            clf.fit((X @ p).astype(np.float32), y)
            acc = float((clf.predict((X_dev @ p).astype(np.float32)) == y_dev).mean())
            self.accuracies_.append(acc)
            if acc <= floor:
                break
            basis = _orth(np.vstack([basis, np.asarray(clf.coef_, dtype=np.float64) @ p]))
        self.n_iter_ = len(self.accuracies_)
        # INLP's projection is linear (x -> P x): no centering, so mean_ is 0
        self.mean_, self.left_, self.right_, self.rank_ = np.zeros(self.d_in_), basis.T, basis, len(basis)
        return self
