"""Token identity and prediction through the layers: mutual information between a layer's vectors and a
token label (Voita, Sennrich & Titov 2019, "The bottom-up evolution of representations in the
Transformer: a study with machine translation and language modelling objectives", section 3).

Voita et al.'s estimator: quantise the vectors of one layer with k-means, fitted on the occurrences of
a fixed set of frequent tokens, and compute the plug-in mutual information between the cluster ids C
and the token ids Y on those occurrences (K and the token set are arguments here; docs/flow.md gives
the defaults and how they differ from the paper's),

    I(C; Y) = sum_{c, y} p(c, y) log2 p(c, y) / (p(c) p(y))      (bits),

read beside H(Y), its ceiling (a layer that copies the token reaches it once the clusters separate the
tokens). `KMeansMI` is that estimator, shaped like a scikit-learn estimator: `fit(X, y, groups)` fits
the quantiser and `mi_` / `entropy_` / `ci_` are the fitted state; `ci_` is a percentile bootstrap over
groups (e.g. sentences) of the plug-in MI with the clusters held fixed, moved by the bootstrap's
estimate of the resampling bias.

The probe-based estimate beside it (`ProbeMI`, Pimentel et al. 2020's variational view): a linear
probe q(y | x) trained on one half of the groups and read on the other gives the lower bound
I(X; Y) >= H(Y) - CE(q), CE the held-out cross-entropy in bits with the marginal H(Y) taken from the
training half's label frequencies (smoothed). It is biased low where the plug-in estimate is biased high
(the plug-in MI of K clusters x V tokens on N items is inflated by about (K-1)(V-1) / (2 N ln 2) bits:
Miller 1955), which is why a shuffled-token control (`shuffled_control`) belongs beside every number.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from sklearn.cluster import MiniBatchKMeans
from threadpoolctl import threadpool_limits

from probes.logreg import LogisticRegressionLBFGS


def discrete_mi(a: np.ndarray, b: np.ndarray) -> float:
    """Plug-in mutual information in bits between two (N,) integer label arrays."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"discrete_mi: need two non-empty (N,) arrays of equal length, got {a.shape} and {b.shape}")
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    return _coded_mi(ai, bi, int(bi.max()) + 1)


def _coded_mi(ai: np.ndarray, bi: np.ndarray, nb: int) -> float:
    """discrete_mi on codes 0..na-1 and 0..nb-1 (the bootstrap's fast path: no re-coding)."""
    joint = np.bincount(ai * nb + bi, minlength=(int(ai.max()) + 1) * nb).reshape(-1, nb).astype(np.float64)
    joint /= joint.sum()
    pa, pb = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log2(joint[nz] / (pa @ pb)[nz])).sum())


def entropy_bits(y: np.ndarray) -> float:
    """Plug-in entropy H(Y) in bits of an (N,) label array."""
    _, counts = np.unique(np.asarray(y), return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def group_bootstrap(groups: np.ndarray, statistic: Callable[[np.ndarray], float], n_boot: int = 200,
                    level: float = 0.95, seed: int = 0, point: float | None = None) -> tuple[float, float]:
    """Percentile interval of `statistic(rows)` when whole groups (N,) are resampled with replacement;
    `statistic` takes the (M,) row indices of one resample. With `point` (the statistic on all rows) the
    interval is moved by point - mean(resamples): the plug-in MI of a resample is inflated by its
    duplicated items, so the raw percentiles sit above the estimate (a shuffled control read
    0.94 [1.21, 1.43] bits on the demo decoder)."""
    groups = np.asarray(groups)
    uniq, inv = np.unique(groups, return_inverse=True)
    members = np.split(np.argsort(inv, kind="stable"), np.cumsum(np.bincount(inv))[:-1])
    rng = np.random.default_rng(seed)
    vals = [statistic(np.concatenate([members[g] for g in rng.integers(0, len(uniq), len(uniq))]))
            for _ in range(n_boot)]
    lo, hi = np.quantile(vals, [0.5 - level / 2, 0.5 + level / 2])
    shift = 0.0 if point is None else point - float(np.mean(vals))
    return float(lo + shift), float(hi + shift)


def _check(X: np.ndarray, y: np.ndarray, groups: np.ndarray | None, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = np.asarray(X, dtype=np.float32), np.asarray(y)
    if X.ndim != 2 or y.shape != (len(X),):
        raise ValueError(f"{where}: X must be (N, D) and y (N,), got {X.shape} and {y.shape}")
    groups = np.arange(len(X)) if groups is None else np.asarray(groups)
    if groups.shape != y.shape:
        raise ValueError(f"{where}: groups must be (N,) like y, got {groups.shape}")
    if not np.isfinite(X).all():
        raise ValueError(f"{where}: X has non-finite values")
    return X, y, groups


class KMeansMI:
    """Voita et al.'s (2019) estimate of I(layer; token): k-means on X, plug-in MI of (cluster, y).

    n_clusters: k-means' K (capped at the number of distinct rows); n_boot, level: the bootstrap over
    groups; seed: k-means' and the bootstrap's. Fitted: `labels_` (N,) cluster ids, `mi_` (bits),
    `entropy_` (H(Y), bits), `ci_` (low, high) of `mi_`."""

    def __init__(self, n_clusters: int = 100, n_boot: int = 200, level: float = 0.95, seed: int = 0) -> None:
        self.n_clusters = n_clusters
        self.n_boot = n_boot
        self.level = level
        self.seed = seed

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> "KMeansMI":
        X, y, groups = _check(X, y, groups, "KMeansMI.fit")
        k = min(self.n_clusters, len(np.unique(X, axis=0)))
        km = MiniBatchKMeans(n_clusters=k, random_state=self.seed, n_init=1, batch_size=2048)
        # one thread: on (thousands x hundreds) rows the BLAS/OpenMP pools cost more than they give
        # (a 2,500 x 256 fit: 2.6 s with two threads on a loaded 2-core box, 0.14 s with one); the
        # clustering is the same
        with threadpool_limits(limits=1):
            self.labels_ = km.fit_predict(X)
        return self._score(y, groups)

    def _score(self, y: np.ndarray, groups: np.ndarray) -> "KMeansMI":
        """mi_, entropy_ and ci_ of the fitted clusters `labels_` against labels y (N,)."""
        self.mi_ = discrete_mi(self.labels_, y)
        self.entropy_ = entropy_bits(y)
        _, yi = np.unique(y, return_inverse=True)
        nb = int(yi.max()) + 1
        self.ci_ = group_bootstrap(groups, lambda i: _coded_mi(self.labels_[i], yi[i], nb), self.n_boot,
                                   self.level, self.seed, point=self.mi_)
        return self

    def fit_shuffled(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
                     seed: int = 0) -> "KMeansMI":
        """A new estimator fitted as `shuffled_control(KMeansMI(same settings), X, y, groups, seed)`
        would fit it, without clustering again: k-means never sees y, so on the X of this estimator's
        last `fit` the clusters are these (tests/probes/test_flow.py checks the equality)."""
        X, y, groups = _check(X, y, groups, "KMeansMI.fit_shuffled")
        if not hasattr(self, "labels_") or len(self.labels_) != len(X):
            raise ValueError("KMeansMI.fit_shuffled: fit the estimator on the same X first")
        twin = KMeansMI(self.n_clusters, self.n_boot, self.level, self.seed)
        twin.labels_ = self.labels_
        return twin._score(np.random.default_rng(seed).permutation(y), groups)


class ProbeMI:
    """The probe-based lower bound I(X; Y) >= H(Y) - CE(q) in bits (module docstring): a multinomial
    logistic probe on standardised features, fitted on the groups of one random half, read on the rest (labels unseen in
    training are dropped from the test half and counted in `n_dropped_`). The bound falls below 0 where
    the probe overfits a layer that knows nothing of y. Fitted: `mi_`, `entropy_`,
    `ce_` (held-out cross-entropy, bits), `ci_` (bootstrap over test groups of H - CE)."""

    def __init__(self, C: float = 0.1, max_iter: int = 100, n_boot: int = 200, level: float = 0.95,
                 seed: int = 0) -> None:
        self.C = C
        self.max_iter = max_iter
        self.n_boot = n_boot
        self.level = level
        self.seed = seed

    def fit(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> "ProbeMI":
        X, y, groups = _check(X, y, groups, "ProbeMI.fit")
        rng = np.random.default_rng(self.seed)
        uniq = np.unique(groups)
        train_groups = rng.permutation(uniq)[: len(uniq) // 2]
        tr = np.isin(groups, train_groups)
        labels, counts = np.unique(y[tr], return_counts=True)
        te = ~tr & np.isin(y, labels)
        self.n_dropped_ = int((~tr).sum() - te.sum())
        mu, sd = X[tr].mean(0), X[tr].std(0) + 1e-6  # standardised on the training half: C means the same
        Z = (X - mu) / sd                               # at every layer, whatever the vectors' scale
        probe = LogisticRegressionLBFGS(C=self.C, max_iter=self.max_iter).fit(Z[tr], y[tr])
        proba = probe.predict_proba(Z[te])  # (N_te, V_train) in the order of probe.classes_ == labels
        code = np.searchsorted(labels, y[te])
        nll = -np.log2(np.clip(proba[np.arange(len(code)), code], 1e-12, None))  # (N_te,)
        prior = (counts + 1.0) / (counts.sum() + len(counts))  # add-one marginal from the training half
        h_item = -np.log2(prior[code])  # each test item's code length under the marginal
        self.entropy_ = float(h_item.mean())
        self.ce_ = float(nll.mean())
        self.mi_ = self.entropy_ - self.ce_
        gain = h_item - nll
        self.ci_ = group_bootstrap(groups[te], lambda i: float(gain[i].mean()), self.n_boot, self.level, self.seed)
        return self

    def fit_shuffled(self, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
                     seed: int = 0) -> "ProbeMI":
        """A new estimator of the same settings fitted by `shuffled_control` (the probe sees y, so it
        is trained again)."""
        return shuffled_control(ProbeMI(self.C, self.max_iter, self.n_boot, self.level, self.seed), X, y, groups, seed)


def shuffled_control(estimator, X: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None,
                     seed: int = 0):
    """The same estimator fitted with y permuted across items: the MI a layer 'has' about a label it
    cannot know (the estimator's bias floor). Returns the fitted estimator."""
    y = np.asarray(y)
    return estimator.fit(X, np.random.default_rng(seed).permutation(y), groups)


# estimator name -> class; the analysis asks this registry, never a name branch. Each class has
# fit(X, y, groups) and, once fitted on X, fit_shuffled(X, y, groups, seed): its shuffled control
MI_ESTIMATORS: dict[str, type] = {"kmeans": KMeansMI, "probe": ProbeMI}
