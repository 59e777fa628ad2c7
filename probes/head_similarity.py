"""Distances between attention heads (Clark et al. 2019, sec. 6 and Fig. 6).

Clark et al. 2019 define the distance between heads i and j as the sum over tokens of the
Jensen-Shannon divergence between their attention distributions. A head's distribution for word w is
its full row over words and special tokens, [attn | special] (see probes/heads.py), so the rows of one
sentence share their support across heads and models.

    JSD(p, q) = H((p + q) / 2) - (H(p) + H(q)) / 2          (natural log: 0 <= JSD <= ln 2)

We report the corpus *mean* over words (Clark's sum divided by the word count) of
- the JS divergence (nats, bounded by ln 2), and
- the JS distance sqrt(JSD) (bounded by sqrt(ln 2) ~ 0.833; divide by sqrt(ln 2) for base 2, <= 1).
A mean of metrics is a metric, so the mean JS distance is the matrix handed to metric MDS for the 2-D
map of heads (Clark Fig. 6). Both accumulators stream: ``update`` one sentence, then ``finalize``.

Cost of `HeadSimilarity.update`: O((LH)^2 * n * (n + k)) per sentence (all head pairs of all words);
``max_words`` caps the corpus, as Clark et al. used a sample of tokens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.manifold import MDS

from probes.heads import check_rows

_TINY = np.float32(1e-30)
_BLOCK_ELEMENTS = 1 << 23  # (pairs x words x support) floats per chunk (~32 MB float32)


def full_rows(item, special=None, tol: float = 2e-3, where: str = "sentence") -> np.ndarray:
    """Return [attn | special] as float32 (L, H, n, n + k), checked to be distributions.

    ``item`` is an (L, H, n, n) array, an (attn, special) tuple or anything with ``.attn`` and
    ``.special`` (a probes.heads.Sentence). special may be (L, H, n, k), (L, H, n) or None.
    """
    if hasattr(item, "attn"):
        item, special = item.attn, item.special
    elif isinstance(item, tuple):
        item, special = item
    A = np.asarray(item, dtype=np.float32)
    if A.ndim != 4 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{where}: attn must be (L, H, n, n), got {A.shape}")
    if special is not None:
        S = np.asarray(special, dtype=np.float32)
        S = S[..., None] if S.ndim == 3 else S
        if S.shape[:3] != A.shape[:3]:
            raise ValueError(f"{where}: special must be (L, H, n, k) with (L, H, n) = {A.shape[:3]}, got {S.shape}")
        A = np.concatenate([A, S], axis=-1)
    check_rows(A, tol, where)
    return A


def _entropy(P: np.ndarray) -> np.ndarray:
    return -(P * np.log(np.maximum(P, _TINY))).sum(-1)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """JSD(p, q) in nats over the last axis (broadcasting); clipped at 0 against rounding."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    return np.maximum(_entropy((p + q) / 2) - (_entropy(p) + _entropy(q)) / 2, 0.0)


@dataclass(frozen=True)
class HeadDistances:
    divergence: np.ndarray   # (LH, LH) mean JS divergence over words, nats
    distance: np.ndarray     # (LH, LH) mean JS distance sqrt(JSD) over words
    n_words: int
    shape: tuple[int, int]   # (L, H); flat head index = layer * H + head


class HeadSimilarity:
    """Streaming mean JS divergence/distance between every pair of heads of one model."""

    def __init__(self, max_words: int | None = None, tol: float = 2e-3) -> None:
        self.max_words = max_words
        self.tol = tol
        self.n_words_ = 0
        self.n_sentences_ = 0
        self.skipped_ = 0  # sentences not used because max_words was reached
        self.shape_: tuple[int, int] | None = None

    def update(self, item, special=None) -> "HeadSimilarity":
        rows = full_rows(item, special, self.tol, f"sentence {self.n_sentences_}")
        L, H, n, m = rows.shape
        if self.shape_ is None:
            self.shape_ = (L, H)
            self.div_sum_ = np.zeros((L * H, L * H))
            self.dist_sum_ = np.zeros((L * H, L * H))
        elif self.shape_ != (L, H):
            raise ValueError(f"sentence {self.n_sentences_}: (layers, heads) {(L, H)} != {self.shape_}")
        self.n_sentences_ += 1
        if self.max_words is not None:
            n = min(n, self.max_words - self.n_words_)
            if n <= 0:
                self.skipped_ += 1
                return self
        P = rows.reshape(L * H, -1, m)[:, :n]  # (LH, n, m)
        ent = _entropy(P)  # (LH, n)
        step = max(1, _BLOCK_ELEMENTS // max(1, L * H * n * m))
        for a0 in range(0, L * H, step):  # chunks of heads only bound memory; math is vectorised
            Pa = P[a0:a0 + step]
            mix = _entropy((Pa[:, None] + P[None]) / 2)  # (step, LH, n)
            jsd = np.maximum(mix - (ent[a0:a0 + step, None] + ent[None]) / 2, 0.0)
            self.div_sum_[a0:a0 + step] += jsd.sum(-1)
            self.dist_sum_[a0:a0 + step] += np.sqrt(jsd).sum(-1)
        self.n_words_ += n
        return self

    def finalize(self) -> HeadDistances:
        if self.shape_ is None or self.n_words_ == 0:
            raise ValueError("HeadSimilarity: no words were added (call update first)")
        div, dist = self.div_sum_ / self.n_words_, self.dist_sum_ / self.n_words_
        # exact symmetry and zero diagonal (float32 rounding can leave ~1e-8 residues)
        div, dist = (div + div.T) / 2, (dist + dist.T) / 2
        np.fill_diagonal(div, 0.0)
        np.fill_diagonal(dist, 0.0)
        return HeadDistances(div, dist, self.n_words_, self.shape_)


def head_distances(sentences, max_words: int | None = None) -> HeadDistances:
    """Mean JS divergence and distance between all heads over an iterable of sentences."""
    acc = HeadSimilarity(max_words=max_words)
    for s in sentences:
        acc.update(s)
    return acc.finalize()


def mds_embedding(distance: np.ndarray, seed: int = 0, n_init: int = 4) -> np.ndarray:
    """2-D metric MDS of a precomputed (N, N) distance matrix (Clark et al. 2019 Fig. 6) -> (N, 2)."""

    D = np.asarray(distance, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1] or not np.allclose(D, D.T):
        raise ValueError(f"distance must be a symmetric square matrix, got shape {D.shape}")
    params = inspect.signature(MDS).parameters
    if "metric_mds" in params:  # scikit-learn >= 1.8 renamed dissimilarity -> metric
        mds = MDS(n_components=2, metric="precomputed", metric_mds=True, n_init=n_init, init="random",
                  random_state=seed)
    else:
        mds = MDS(n_components=2, dissimilarity="precomputed", n_init=n_init, random_state=seed)
    return mds.fit_transform(D)


class HeadChangeJS:
    """Streaming mean JS divergence of the *same* head in two models, per head -> (L, H).

    Compares e.g. a finetuned model with its frozen original (Kovaleva et al. 2019 style); both
    models must see the same sentences, tokenised the same way, so rows share their support.
    """

    def __init__(self, tol: float = 2e-3) -> None:
        self.tol = tol
        self.n_words_ = 0
        self.n_sentences_ = 0
        self.sum_: np.ndarray | None = None

    def update(self, a, b) -> "HeadChangeJS":
        where = f"sentence {self.n_sentences_}"
        Pa, Pb = full_rows(a, tol=self.tol, where=where + " (model a)"), full_rows(b, tol=self.tol, where=where + " (model b)")
        if Pa.shape != Pb.shape:
            raise ValueError(f"{where}: models a and b give shapes {Pa.shape} and {Pb.shape}")
        jsd = np.maximum(_entropy((Pa + Pb) / 2) - (_entropy(Pa) + _entropy(Pb)) / 2, 0.0)  # (L, H, n)
        self.sum_ = jsd.sum(-1, dtype=np.float64) if self.sum_ is None else self.sum_ + jsd.sum(-1)
        self.n_words_ += Pa.shape[2]
        self.n_sentences_ += 1
        return self

    def finalize(self) -> np.ndarray:
        if self.sum_ is None or self.n_words_ == 0:
            raise ValueError("HeadChangeJS: no words were added")
        return self.sum_ / self.n_words_


def js_divergence_per_head(attn_a_sentences, attn_b_sentences) -> np.ndarray:
    """Mean over words of JSD(head (l, h) in model a, same head in model b) -> (L, H), nats.

    Each sentence is an (L, H, n, n) array, an (attn, special) tuple or a probes.heads.Sentence.
    """
    acc = HeadChangeJS()
    sentinel = object()
    it_b = iter(attn_b_sentences)
    for a in attn_a_sentences:
        b = next(it_b, sentinel)
        if b is sentinel:
            raise ValueError(f"model b has fewer sentences than model a ({acc.n_sentences_})")
        acc.update(a, b)
    if next(it_b, sentinel) is not sentinel:
        raise ValueError(f"model b has more sentences than model a ({acc.n_sentences_})")
    return acc.finalize()


def head_change_frame(values: np.ndarray, model_a: str, model_b: str, metric: str = "js_divergence") -> pd.DataFrame:
    """(L, H) per-head values -> the ``head_change`` table (model_a, model_b, layer, head, metric, value)."""
    L, H = values.shape
    layer, head = np.divmod(np.arange(L * H), H)
    return pd.DataFrame({"model_a": model_a, "model_b": model_b, "layer": layer, "head": head,
                         "metric": metric, "value": values.reshape(-1)})
