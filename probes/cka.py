"""Centered kernel alignment between representations (Kornblith et al. 2019).

For n examples with representations X (n, d1) and Y (n, d2), Gram matrices K = k(X), L = k(Y) and
the centering matrix H = I - 11^T / n (Kornblith et al. 2019, "Similarity of Neural Network
Representations Revisited", eq. 1-3):

    HSIC(K, L) = tr(K H L H) / (n - 1)^2,   CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)).

With a linear kernel and column-centered X, Y this is
    CKA = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F),
which `cka_matrix` evaluates in feature space with d x d products (never an n x n Gram).

The RBF kernel k(x, x') = exp(-||x - x'||^2 / (2 sigma^2)) takes sigma = sigma_frac * sqrt(median
squared distance), the median over the whole n x n matrix as in Kornblith et al.'s reference code.

Debiased HSIC (Song et al. 2012, "Feature Selection via Dependence Maximization", eq. 5), with
K~ = K and L~ = L with zeroed diagonals:
    HSIC_1 = [tr(K~ L~) + (1^T K~ 1)(1^T L~ 1) / ((n-1)(n-2)) - 2/(n-2) 1^T K~ L~ 1] / (n (n-3)).
Minibatch CKA (Nguyen et al. 2021, "Do Wide and Deep Networks Learn the Same Things?", eq. 2)
averages HSIC_1 over k minibatches before taking the ratio:
    CKA_mb = mean_i HSIC_1(K_i, L_i) / sqrt(mean_i HSIC_1(K_i, K_i) mean_i HSIC_1(L_i, L_i)).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd

_CHUNK_ROWS = 4096       # rows per float32 GEMM chunk; chunk sums are accumulated in float64
_FLOAT64_ELEMENTS = 1 << 22  # stacks up to this size stay float64 throughout
_MAX_GRAM_N = 10_000     # n x n kernels beyond this should use MinibatchCKA


def _as_2d(X, name: str) -> np.ndarray:
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} must be (n_examples, n_features), got shape {X.shape}")
    return X


def _check_pair(X, Y) -> tuple[np.ndarray, np.ndarray]:
    X, Y = _as_2d(X, "X"), _as_2d(Y, "Y")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"X and Y must have the same number of examples, got {X.shape[0]} and {Y.shape[0]}")
    return X, Y


def center(X: np.ndarray) -> np.ndarray:
    """Column-centered float64 copy of X (n, d)."""
    X = np.asarray(X, dtype=np.float64)
    return X - X.mean(0, keepdims=True)


def gram_linear(X: np.ndarray) -> np.ndarray:
    """K = X X^T, (n, n) float64."""
    X = np.asarray(X, dtype=np.float64)
    return X @ X.T


def gram_rbf(X: np.ndarray, sigma_frac: float = 0.5) -> np.ndarray:
    """RBF Gram with sigma = sigma_frac * sqrt(median squared distance) (Kornblith et al. 2019)."""
    if sigma_frac <= 0:
        raise ValueError(f"sigma_frac must be > 0, got {sigma_frac}")
    G = gram_linear(X)
    sq = np.diag(G)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2 * G, 0.0)
    med = np.median(d2)
    if med <= 0:
        raise ValueError("rbf kernel: the median squared distance is 0 (mostly identical rows)")
    return np.exp(-d2 / (2 * sigma_frac**2 * med))


def center_gram(K: np.ndarray) -> np.ndarray:
    """H K H: double-centered Gram matrix."""
    K = np.asarray(K, dtype=np.float64)
    return K - K.mean(0, keepdims=True) - K.mean(1, keepdims=True) + K.mean()


def hsic_biased(K: np.ndarray, L: np.ndarray) -> float:
    """tr(K H L H) / (n - 1)^2 (Gretton et al. 2005), K and L (n, n)."""
    n = K.shape[0]
    return float(np.sum(center_gram(K) * center_gram(L)) / (n - 1) ** 2)


def hsic_unbiased(K: np.ndarray, L: np.ndarray) -> float:
    """Song et al. 2012 unbiased HSIC_1 of two (n, n) Grams (diagonals are ignored); needs n > 3."""
    n = K.shape[0]
    if n <= 3:
        raise ValueError(f"the unbiased HSIC estimator needs n > 3 examples, got {n}")
    K, L = np.array(K, dtype=np.float64), np.array(L, dtype=np.float64)
    np.fill_diagonal(K, 0.0)
    np.fill_diagonal(L, 0.0)
    k1, l1 = K.sum(1), L.sum(1)
    t = np.sum(K * L) + k1.sum() * l1.sum() / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (k1 @ l1)
    return float(t / (n * (n - 3)))


def cka_from_grams(K: np.ndarray, L: np.ndarray, debiased: bool = False) -> float:
    """CKA of two (n, n) Gram matrices; debiased uses Song et al.'s HSIC_1 for all three terms."""
    hsic = hsic_unbiased if debiased else hsic_biased
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def linear_cka(X: np.ndarray, Y: np.ndarray, debiased: bool = False) -> float:
    """Linear CKA of X (n, d1) and Y (n, d2): ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F), centered.

    debiased=True uses HSIC_1 (Song et al. 2012), computed in feature space in O(n d^2).
    """
    X, Y = _check_pair(X, Y)
    return float(_linear_matrix([X], [Y], debiased=debiased)[0, 0])


def rbf_cka(X: np.ndarray, Y: np.ndarray, sigma_frac: float = 0.5, debiased: bool = False) -> float:
    """RBF-kernel CKA of X (n, d1) and Y (n, d2), bandwidth from the median distance (Kornblith)."""
    X, Y = _check_pair(X, Y)
    return cka_from_grams(gram_rbf(X, sigma_frac), gram_rbf(Y, sigma_frac), debiased)


# ---------------------------------------------------------------- layer-by-layer matrices
class _LinearTerms:
    """Centered float32 stack of layers plus the float64 per-example and per-layer statistics."""

    def __init__(self, layers: Sequence[np.ndarray], name: str) -> None:
        layers = [_as_2d(X, f"{name}[{i}]") for i, X in enumerate(layers)]
        if not layers:
            raise ValueError(f"{name} is empty")
        n = {X.shape[0] for X in layers}
        if len(n) != 1:
            raise ValueError(f"{name}: all layers need the same number of examples, got {sorted(n)}")
        self.n = n.pop()
        self.dims = [X.shape[1] for X in layers]
        self.edges = np.concatenate([[0], np.cumsum(self.dims)])
        # (n, sum d) centered; float32 GEMMs only where the stack is large enough to matter
        dtype = np.float64 if self.n * self.edges[-1] <= _FLOAT64_ELEMENTS else np.float32
        self.Z = np.empty((self.n, self.edges[-1]), dtype=dtype)
        self.sq = np.empty((len(layers), self.n))                       # ||x_i||^2 per layer, float64
        for l, X in enumerate(layers):
            Zl = self.Z[:, self.edges[l]:self.edges[l + 1]]
            Zl[...] = X
            Zl -= X.mean(0, dtype=np.float64).astype(dtype)  # mean taken in float64
            for r0 in range(0, self.n, _CHUNK_ROWS):
                c = Zl[r0:r0 + _CHUNK_ROWS]
                self.sq[l, r0:r0 + _CHUNK_ROWS] = np.einsum("ij,ij->i", c, c, dtype=np.float64)

    def block(self, G: np.ndarray, other: "_LinearTerms", i: int, j: int) -> np.ndarray:
        return G[self.edges[i]:self.edges[i + 1], other.edges[j]:other.edges[j + 1]]


def _cross(a: _LinearTerms, b: _LinearTerms) -> np.ndarray:
    """Z_a^T Z_b, (sum d_a, sum d_b): GEMMs over row chunks, chunk results summed in float64."""
    G = np.zeros((a.Z.shape[1], b.Z.shape[1]))
    for r0 in range(0, a.n, _CHUNK_ROWS):
        G += a.Z[r0:r0 + _CHUNK_ROWS].T @ b.Z[r0:r0 + _CHUNK_ROWS]
    return G


def _frob2(a: _LinearTerms, b: _LinearTerms, G: np.ndarray) -> np.ndarray:
    """||Z_b[j]^T Z_a[i]||_F^2 for all (i, j) -> (La, Lb)."""
    return np.array([[np.sum(a.block(G, b, i, j) ** 2) for j in range(len(b.dims))]
                     for i in range(len(a.dims))])


def _hsic_terms(tr: np.ndarray, sa: np.ndarray, sb: np.ndarray, n: int, debiased: bool) -> np.ndarray:
    """HSIC of linear kernels from tr(K L) = ||Y^T X||_F^2 (centered data), all pairs at once.

    sa (La, n), sb (Lb, n): squared row norms = the Gram diagonals. With centered data K 1 = 0, so
    K~ 1 = -diag(K) and 1^T K~ 1 = -sum diag(K); Song et al.'s HSIC_1 then needs only these.
    """
    if not debiased:
        return tr / (n - 1) ** 2
    if n <= 3:
        raise ValueError(f"the unbiased HSIC estimator needs n > 3 examples, got {n}")
    tr_t = tr - sa @ sb.T                                    # tr(K~ L~)
    ones = np.outer(sa.sum(1), sb.sum(1))                    # (1^T K~ 1)(1^T L~ 1)
    cross = sa @ sb.T                                        # (K~ 1) . (L~ 1)
    return (tr_t + ones / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * cross) / (n * (n - 3))


def _linear_matrix(layers_a, layers_b=None, debiased: bool = False) -> np.ndarray:
    a = _LinearTerms(layers_a, "layers_a")
    b = a if layers_b is None else _LinearTerms(layers_b, "layers_b")
    if a.n != b.n:
        raise ValueError(f"layers_a and layers_b must cover the same examples, got n={a.n} and n={b.n}")
    G_ab = _cross(a, b)
    self_a = _self_tr(a, G_ab if b is a else None)
    self_b = self_a if b is a else _self_tr(b, None)
    hab = _hsic_terms(_frob2(a, b, G_ab), a.sq, b.sq, a.n, debiased)
    haa = np.diag(_hsic_terms(np.diag(self_a), a.sq, a.sq, a.n, debiased))
    hbb = np.diag(_hsic_terms(np.diag(self_b), b.sq, b.sq, b.n, debiased))
    with np.errstate(invalid="ignore", divide="ignore"):
        return hab / np.sqrt(np.outer(haa, hbb))


def _self_tr(t: _LinearTerms, G: np.ndarray | None) -> np.ndarray:
    """||Z_l^T Z_l||_F^2 per layer (La,), reusing the diagonal blocks of G when given."""
    out = []
    for l in range(len(t.dims)):
        if G is not None:
            B = t.block(G, t, l, l)
        else:
            Zl = t.Z[:, t.edges[l]:t.edges[l + 1]]
            B = np.zeros((t.dims[l], t.dims[l]))
            for r0 in range(0, t.n, _CHUNK_ROWS):
                B += Zl[r0:r0 + _CHUNK_ROWS].T @ Zl[r0:r0 + _CHUNK_ROWS]
        out.append(np.sum(B**2))
    return np.array(out)


def _rbf_matrix(layers_a, layers_b=None, debiased: bool = False, sigma_frac: float = 0.5) -> np.ndarray:
    n = _as_2d(layers_a[0], "layers_a[0]").shape[0]
    if n > _MAX_GRAM_N:
        raise ValueError(f"rbf CKA builds n x n Grams; n={n} > {_MAX_GRAM_N}: subsample or use MinibatchCKA")
    hsic = hsic_unbiased if debiased else hsic_biased
    Ka = [gram_rbf(X, sigma_frac) for X in layers_a]
    Kb = Ka if layers_b is None else [gram_rbf(X, sigma_frac) for X in layers_b]
    if Kb[0].shape != Ka[0].shape:
        raise ValueError("layers_a and layers_b must cover the same examples")
    self_a = np.array([hsic(K, K) for K in Ka])
    self_b = self_a if layers_b is None else np.array([hsic(K, K) for K in Kb])
    cross = np.array([[hsic(K, L) for L in Kb] for K in Ka])
    return cross / np.sqrt(np.outer(self_a, self_b))


CKA_KINDS: dict[str, Callable] = {"linear": _linear_matrix, "rbf": _rbf_matrix}


def cka_matrix(layers_a: Sequence[np.ndarray], layers_b: Sequence[np.ndarray] | None = None,
               kind: str = "linear", debiased: bool = False, **kwargs) -> np.ndarray:
    """CKA between every layer of a (La arrays (n, d_l)) and of b (default: a itself) -> (La, Lb).

    Linear: one GEMM Z_a^T Z_b over the concatenated centered layers (float32 for large stacks),
    accumulated over row chunks in float64; self terms reuse the diagonal blocks when b is a. O(n (sum d_a)(sum d_b)), no n x n matrix.
    kind="rbf" (kwargs: sigma_frac) builds n x n Grams and is meant for n up to ~10^4.
    """
    if kind not in CKA_KINDS:
        raise ValueError(f"unknown CKA kind {kind!r}; valid: {sorted(CKA_KINDS)}")
    return CKA_KINDS[kind](list(layers_a), None if layers_b is None else list(layers_b), debiased=debiased, **kwargs)


class MinibatchCKA:
    """Minibatch linear CKA for all layer pairs at once (Nguyen et al. 2021).

    ``update(batch_a, batch_b=None)`` with La arrays (b, d_l) (and Lb arrays for b; None = a) adds
    HSIC_1 of every pair of this minibatch's linear Grams; ``finalize()`` -> (La, Lb).
    """

    def __init__(self) -> None:
        self.n_batches_ = 0
        self.hsic_ab_: np.ndarray | None = None

    @staticmethod
    def _grams(batch, name: str) -> np.ndarray:
        Ks = np.stack([gram_linear(_as_2d(X, f"{name}[{i}]")) for i, X in enumerate(batch)])  # (L, b, b)
        b = Ks.shape[1]
        if b <= 3:
            raise ValueError(f"{name}: minibatches need more than 3 examples for HSIC_1, got {b}")
        Ks[:, np.arange(b), np.arange(b)] = 0.0
        return Ks

    @staticmethod
    def _hsic1(Ka: np.ndarray, Kb: np.ndarray) -> np.ndarray:
        """Song et al. 2012 HSIC_1 for all pairs of zero-diagonal Grams: (La, b, b), (Lb, b, b) -> (La, Lb)."""
        n = Ka.shape[1]
        ka, kb = Ka.sum(2), Kb.sum(2)  # (L, b) = K~ 1
        tr = np.einsum("aij,bij->ab", Ka, Kb)
        t = tr + np.outer(ka.sum(1), kb.sum(1)) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (ka @ kb.T)
        return t / (n * (n - 3))

    def update(self, batch_a: Sequence[np.ndarray], batch_b: Sequence[np.ndarray] | None = None) -> "MinibatchCKA":
        Ka = self._grams(batch_a, "batch_a")
        Kb = Ka if batch_b is None else self._grams(batch_b, "batch_b")
        if Ka.shape[1] != Kb.shape[1]:
            raise ValueError(f"batch_a and batch_b must hold the same examples, got {Ka.shape[1]} and {Kb.shape[1]}")
        hab = self._hsic1(Ka, Kb)
        haa = np.diag(self._hsic1(Ka, Ka)) if batch_b is not None else np.diag(hab)
        hbb = np.diag(hab) if batch_b is None else np.diag(self._hsic1(Kb, Kb))
        if self.hsic_ab_ is None:
            self.hsic_ab_, self.hsic_aa_, self.hsic_bb_ = hab, haa, hbb
        else:
            if hab.shape != self.hsic_ab_.shape:
                raise ValueError(f"number of layers changed: {hab.shape} vs {self.hsic_ab_.shape}")
            self.hsic_ab_, self.hsic_aa_, self.hsic_bb_ = self.hsic_ab_ + hab, self.hsic_aa_ + haa, self.hsic_bb_ + hbb
        self.n_batches_ += 1
        return self

    def finalize(self) -> np.ndarray:
        if self.hsic_ab_ is None:
            raise ValueError("MinibatchCKA: no minibatches were added")
        return self.hsic_ab_ / np.sqrt(np.outer(self.hsic_aa_, self.hsic_bb_))


def cka_frame(matrix: np.ndarray, model_a: str, model_b: str, kind: str = "linear") -> pd.DataFrame:
    """(La, Lb) CKA values -> the ``cka`` table (model_a, model_b, layer_a, layer_b, kind, value)."""
    La, Lb = matrix.shape
    la, lb = np.divmod(np.arange(La * Lb), Lb)
    return pd.DataFrame({"model_a": model_a, "model_b": model_b, "layer_a": la, "layer_b": lb,
                         "kind": kind, "value": matrix.reshape(-1)})
