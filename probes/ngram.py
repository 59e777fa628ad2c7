"""A token bigram language model with Witten-Bell smoothing: the n-gram floor of the minimal-pair
evaluation (Marvin & Linzen 2018 and Warstadt et al. 2020, BLiMP, report n-gram baselines beside
the neural models; Witten & Bell 1991, as Chen & Goodman 1999, Sec. 2.4, write it):

    p(b | a) = (c(a, b) + T(a) p_uni(b)) / (c(a) + T(a)),    p_uni(b) = (c(b) + 1) / (N + V),

with c(a) the count of a as a context, T(a) the number of distinct tokens that follow a, and an
add-one unigram so every token has mass. A context never seen (c(a) = 0) backs off to p_uni. It has
no tuning constant: the interpolation weight of each context comes from its own counts.

Shaped like an estimator: `BigramLM(vocab_size).fit(ids)` on a 1-D token stream (documents joined by
a separator id, as `plmodels.training.corpus` caches them), then `logprob(seq)` -> (len(seq) - 1,)
natural-log probabilities of seq[1:] given the token before each.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BigramLM:
    """Witten-Bell bigram LM over token ids in [0, vocab_size)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def fit(self, ids: np.ndarray) -> "BigramLM":
        ids = np.asarray(ids, dtype=np.int64)
        V = self.vocab_size
        if ids.ndim != 1 or ids.size < 2:
            raise ValueError(f"BigramLM.fit needs a 1-D stream of at least 2 ids, got shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"BigramLM.fit: ids must lie in [0, {V}), got [{ids.min()}, {ids.max()}]")
        self.unigram_ = np.log((np.bincount(ids, minlength=V) + 1.0) / (ids.size + V))  # (V,)
        keys, counts = np.unique(ids[:-1] * V + ids[1:], return_counts=True)
        self.pair_keys_, self.pair_counts_ = keys, counts  # sorted (a * V + b) and c(a, b)
        a = keys // V
        self.context_count_ = np.bincount(a, weights=counts, minlength=V)  # c(a) as a context
        self.followers_ = np.bincount(a, minlength=V).astype(np.float64)  # T(a)
        return self

    def pair_count(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        key = np.asarray(a, dtype=np.int64) * self.vocab_size + np.asarray(b, dtype=np.int64)
        pos = np.searchsorted(self.pair_keys_, key).clip(max=len(self.pair_keys_) - 1)
        return np.where(self.pair_keys_[pos] == key, self.pair_counts_[pos], 0).astype(np.float64)

    def logprob(self, seq: Sequence[int]) -> np.ndarray:
        """(len(seq) - 1,) log p(seq[t] | seq[t-1]) for t >= 1."""
        s = np.asarray(seq, dtype=np.int64)
        a, b = s[:-1], s[1:]
        ca, T = self.context_count_[a], self.followers_[a]
        uni = np.exp(self.unigram_[b])
        seen = ca > 0
        p = np.where(seen, (self.pair_count(a, b) + T * uni) / np.where(seen, ca + T, 1.0), uni)
        return np.log(p)
