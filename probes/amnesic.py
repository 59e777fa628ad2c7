"""Removing a property from a layer's vectors, for amnesic probing (Elazar, Ravfogel, Jacovi &
Goldberg 2021, "Amnesic Probing: Behavioral Explanation with Amnesic Counterfactuals"): erase what a
linear probe reads of the property, put the erased vectors back into the model, and see what the
model loses. Two erasers and three controls, shaped like scikit-learn transformers (`fit(X, y)`,
`transform(X)`):

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
  Attributes by Iterative Nullspace Projection"; following shauli-ravfogel/nullspace_projection's
  `get_debiasing_projection`): `n_iter` times, fit a linear classifier on the projected training
  vectors, score it on held-out *dev* vectors, and add the row space of its weights to the removed
  space; P = I - the projection on the span of every removed direction
  (`get_projection_to_intersection_of_nullspaces`), x -> P x. It stops when the classifier's dev
  accuracy falls to `min_accuracy` (default: the dev majority class's share + 0.01). The dev set is
  the reference's: `fit(X, y, X_dev, y_dev)`; without one, a seeded `dev_fraction` of the rows is
  held out (the classifiers are then fitted on the rest). Training accuracy is no stopping rule: a
  classifier with as many weights as there are rows separates any labels on its own training data,
  so it would keep removing directions long after nothing is left to find (`train_accuracies_` keeps
  it beside `accuracies_`, the dev accuracies). The reference skips a classifier under the floor and
  draws the next one (its SGD runs differ); ours is deterministic, so it stops. The classifier
  is `probes.logreg.LogisticRegressionLBFGS` (the reference uses scikit-learn's SGD or LinearSVC); a
  multiclass classifier removes K directions per iteration, as the reference does.

Controls (what an eraser's effect is compared with):

- `MatchedRandomEraser`: random directions that move the vectors as far as the eraser does: an
  orthogonal projection around the mean off `rank` random directions, whose mean squared move on the
  fitting data, E||x - x'||^2, equals a target (the eraser's: `displacement(eraser, X)`). Why it is
  needed: damage to a model grows with how far its vectors are moved, and LEACE's oblique projection
  moves x much further than an orthogonal projection of the same rank (on MiniLM's embedding layer,
  POS, rank 16, on the test words: 2.0x the mean distance, 3.8x the squared one), because the directions a property
  lives in carry more variance than random ones. The choice: directions drawn from N(0, S^gamma)
  (S = Cov(X)), orthonormalised, with the one number gamma set by a bracketing secant search
  (`MatchedRandomEraser._search`) so that the move matches.
  gamma = 0 is the control of Elazar et al. (uniformly random directions of the same rank); gamma > 0
  tilts the draw towards the data's high-variance directions (gamma = 1 draws them like the centred
  data vectors themselves), gamma < 0 away from them. The move tr(Q^T S Q) of the projection on
  span(Q) lies between the sums of the r smallest and the r largest eigenvalues of S (Ky Fan), and so
  does every rank-r projection's that removes a subspace (LEACE's is tr(U^T S U) for the orthonormal
  U of its whitened space), so the target can be reached (at the edges only in the limit: `gamma_`
  stops at +-`max_gamma` and `displacement_` records what was reached; INLP's uncentred projection
  adds ||B mu||^2 to its move and can pass the upper edge, which `displacement_` then shows). The alternatives, and why not:
  scaling a random projection, x - s Q Q^T (x - mu) with s ~ 2, overshoots (it flips the component
  instead of removing it, so the directions are not erased); a random subspace V in LEACE's whitened
  space, x - W^+ P_V W (x - mu), moves x by tr(V^T S V) on average, the same law as a uniformly
  random orthogonal projection, so it is no bigger. The controls of the same size follow Hewitt &
  Liang 2019 ("Designing and interpreting probes with control tasks"): a control must match what the
  compared quantity depends on other than the property, here the size of the move.
- `RandomEraser`: the control of Elazar et al. (a projection removing as many random directions),
  x -> x - Q Q^T (x - mu) with Q uniformly random orthonormal (D, r): the same rank only, which moves
  the vectors less than LEACE does; kept as the `same_rank` control of the amnesic table.
- `ShuffledLabelEraser`: an eraser fitted on permuted labels (LEACE on shuffled POS tags): the same
  estimator with the tie between vectors and labels cut, the control task of Hewitt & Liang applied to
  the eraser. It removes as many directions, none of them the property's.

`displacement(eraser, X)` gives (mean ||x - x'||, mean ||x - x'||^2) over the rows of X.

All work in float64 internally and return float32 (the store's precision).
"""
from __future__ import annotations

from typing import Any, Callable

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


class Eraser(OneLayerEstimator):
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


class LeaceEraser(Eraser):
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


class RandomEraser(Eraser):
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


def _orth(rows: np.ndarray, tol: float = 1e-5) -> np.ndarray:
    """(r, D) orthonormal basis of the row space of `rows`. The tolerance is relative and suits float32
    classifiers: a multinomial classifier's K rows sum to zero up to rounding (a binary one's two rows
    are +w and -w), so their K-th singular value is rounding noise, not a direction to remove."""
    if rows.size == 0:
        return rows
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    return vt[s > tol * max(float(s.max()), 1e-300)]


class INLPEraser(Eraser):
    """INLP: remove, iteration by iteration, the directions a linear classifier uses, while that
    classifier still beats the floor on held-out (dev) vectors."""

    _PARAMS = ("n_iter", "min_accuracy", "C", "seed", "max_iter", "dev_fraction")

    def __init__(self, n_iter: int = 20, min_accuracy: float | None = None, C: float = 1.0, seed: int = 0,
                 max_iter: int = 200, dev_fraction: float = 0.2) -> None:
        self.n_iter, self.min_accuracy, self.C, self.seed, self.max_iter = n_iter, min_accuracy, C, seed, max_iter
        self.dev_fraction = dev_fraction

    def fit(self, X: Any, y: Any, X_dev: Any = None, y_dev: Any = None) -> INLPEraser:
        """X (N, D), y (N,): the classifiers' training rows; X_dev (M, D), y_dev (M,): the rows their
        accuracy is read on (the stopping rule). Without them, a seeded `dev_fraction` of X is held out."""
        X, y = _check_xy(np.asarray(self._layer(X), dtype=np.float64), y)
        self.d_in_ = X.shape[1]
        if (X_dev is None) != (y_dev is None):
            raise ValueError("INLPEraser.fit: give both X_dev and y_dev, or neither")
        if X_dev is None:
            if not 0 < self.dev_fraction < 1:
                raise ValueError(f"INLPEraser: dev_fraction {self.dev_fraction} not in (0, 1)")
            order = np.random.default_rng(self.seed).permutation(len(X))
            n_dev = max(1, int(round(self.dev_fraction * len(X))))
            X_dev, y_dev, X, y = X[order[:n_dev]], y[order[:n_dev]], X[order[n_dev:]], y[order[n_dev:]]
        X_dev = np.asarray(self._layer(X_dev), dtype=np.float64)
        y_dev = np.asarray(y_dev)
        if y_dev.shape != (len(X_dev),):
            raise ValueError(f"y_dev: need one label per row of X_dev ({len(X_dev)}), got shape {y_dev.shape}")
        floor = self.min_accuracy
        if floor is None:
            floor = float(np.max(np.unique(y_dev, return_counts=True)[1]) / len(y_dev)) + 0.01
        basis = np.zeros((0, self.d_in_))
        self.accuracies_: list[float] = []  # dev accuracy of each iteration's classifier (the stopping rule)
        self.train_accuracies_: list[float] = []  # its training accuracy, for comparison only
        for i in range(self.n_iter):
            p = np.eye(self.d_in_) - basis.T @ basis
            clf = LogisticRegressionLBFGS(C=self.C, max_iter=self.max_iter)
            clf.fit((X @ p).astype(np.float32), y)
            self.train_accuracies_.append(float((clf.predict((X @ p).astype(np.float32)) == y).mean()))
            acc = float((clf.predict((X_dev @ p).astype(np.float32)) == y_dev).mean())
            self.accuracies_.append(acc)
            if acc <= floor:
                break
            basis = _orth(np.vstack([basis, np.asarray(clf.coef_, dtype=np.float64) @ p]))
        self.n_iter_ = len(self.accuracies_)
        # INLP's projection is linear (x -> P x): no centering, so mean_ is 0
        self.mean_, self.left_, self.right_, self.rank_ = np.zeros(self.d_in_), basis.T, basis, len(basis)
        return self


def displacement(eraser: Eraser, X: Any) -> tuple[float, float]:
    """(mean ||x - x'||, mean ||x - x'||^2) over the rows of X (N, D), x' = eraser.transform(x), in
    float64 (the move itself, before the float32 rounding of `transform`)."""
    X = np.asarray(eraser._layer(X), dtype=np.float64)
    move = (X - eraser.mean_) @ eraser.right_.T @ eraser.left_.T  # (N, D) = x - x'
    sq = (move ** 2).sum(1)
    return float(np.sqrt(sq).mean()), float(sq.mean())


class MatchedRandomEraser(Eraser):
    """The control of the same size: remove `rank` random directions, drawn from N(0, S^gamma) and
    orthonormalised, with gamma chosen so that the mean squared move on the fitting data equals
    `target` (module docstring: why this family, and the alternatives)."""

    _PARAMS = ("rank", "target", "seed", "rtol", "max_gamma", "tol")

    def __init__(self, rank: int = 1, target: float = 0.0, seed: int = 0, rtol: float = 1e-9,
                 max_gamma: float = 64.0, tol: float = 1e-6) -> None:
        self.rank, self.target, self.seed, self.rtol, self.max_gamma, self.tol = rank, target, seed, rtol, max_gamma, tol

    def fit(self, X: Any, y: Any = None) -> MatchedRandomEraser:
        X = np.asarray(self._layer(X), dtype=np.float64)
        self.d_in_ = X.shape[1]
        if not 0 <= self.rank <= self.d_in_:
            raise ValueError(f"MatchedRandomEraser: rank {self.rank} not in [0, {self.d_in_}]")
        if not self.target >= 0:
            raise ValueError(f"MatchedRandomEraser: target {self.target} must be a mean squared move >= 0")
        self.mean_ = X.mean(0)
        xc = X - self.mean_
        cov = xc.T @ xc / len(X)  # (D, D); the move of the projection on span(Q) is tr(Q^T S Q)
        evals, evecs = np.linalg.eigh(cov)
        # log-eigenvalues, floored, so S^(gamma/2) is formed without overflow for any gamma
        log_ev = np.log(np.maximum(evals, self.tol * max(float(evals.max()), 1e-300)))
        draw = evecs.T @ np.random.default_rng(self.seed).standard_normal((self.d_in_, max(self.rank, 1)))

        def basis(gamma: float) -> np.ndarray:  # (D, r) orthonormal: Q = orth(S^(gamma/2) G)
            w = 0.5 * gamma * log_ev
            q, _ = np.linalg.qr(evecs @ (np.exp(w - w.max())[:, None] * draw))
            return q[:, : self.rank]

        moves: dict[float, float] = {}

        def move(gamma: float) -> float:    # each gamma's QR once: the search reuses the bracket's ends
            if gamma not in moves:
                q = basis(gamma)
                moves[gamma] = float(np.sum(q * (cov @ q)))   # tr(Q^T S Q)
            return moves[gamma]

        lo = hi = 0.0
        if self.rank and move(0.0) < self.target:  # tilt towards the high-variance directions
            hi = 1.0
            while move(hi) < self.target and hi < self.max_gamma:
                lo, hi = hi, min(2 * hi, self.max_gamma)
        elif self.rank and move(0.0) > self.target:  # or away from them
            lo = -1.0
            while move(lo) > self.target and lo > -self.max_gamma:
                lo, hi = max(2 * lo, -self.max_gamma), lo
        if self.rank and not lo == hi:
            lo = hi = self._search(move, lo, hi)
        self.gamma_ = 0.5 * (lo + hi)
        q = basis(self.gamma_)
        self.left_, self.right_, self.rank_ = q, q.T, self.rank
        self.displacement_ = move(self.gamma_) if self.rank else 0.0  # mean squared move reached on X
        return self

    def _search(self, move: Callable[[float], float], lo: float, hi: float) -> float:
        """The gamma in [lo, hi] whose move is the target (to rtol), move being increasing in gamma: a bracketing
        secant search (regula falsi, Illinois variant: an end kept twice in a row has its value halved, so the
        bracket shrinks from both sides), a handful of moves where bisection takes about 35. A target outside
        [move(lo), move(hi)] (an end of the gamma range) gives that end."""
        f_lo, f_hi = move(lo) - self.target, move(hi) - self.target
        if f_lo >= 0 or f_hi <= 0:
            return lo if f_lo >= 0 else hi
        kept = 0
        for _ in range(200):
            mid = hi - f_hi * (hi - lo) / (f_hi - f_lo)
            if not lo < mid < hi:       # rounding at a tiny bracket
                mid = 0.5 * (lo + hi)
            f_mid = move(mid) - self.target
            if abs(f_mid) <= self.rtol * self.target or hi - lo < 1e-12:
                return mid
            if f_mid < 0:
                lo, f_lo = mid, f_mid
                f_hi, kept = (0.5 * f_hi if kept == 1 else f_hi), 1     # hi kept again: halve its value
            else:
                hi, f_hi = mid, f_mid
                f_lo, kept = (0.5 * f_lo if kept == -1 else f_lo), -1
        return 0.5 * (lo + hi)


class ShuffledLabelEraser(Eraser):
    """The eraser `base` (unfitted; LEACE by default) fitted on labels permuted by `seed`: as many
    directions removed, none of them the property's. A dev set's labels (INLP) are permuted too."""

    _PARAMS = ("base", "seed")

    def __init__(self, base: Eraser | None = None, seed: int = 0) -> None:
        self.base, self.seed = base, seed

    def fit(self, X: Any, y: Any, X_dev: Any = None, y_dev: Any = None) -> ShuffledLabelEraser:
        X, y = _check_xy(np.asarray(self._layer(X), dtype=np.float64), y)
        rng = np.random.default_rng(self.seed)
        inner = type(self.base)(**self.base.get_params()) if self.base is not None else LeaceEraser()
        if X_dev is None:
            inner.fit(X, rng.permutation(y))
        else:
            inner.fit(X, rng.permutation(y), X_dev, rng.permutation(np.asarray(y_dev)))
        self.eraser_ = inner
        self.d_in_, self.mean_, self.left_, self.right_, self.rank_ = (
            inner.d_in_, inner.mean_, inner.left_, inner.right_, inner.rank_)
        return self
