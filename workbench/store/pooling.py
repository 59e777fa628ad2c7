"""Pooling: a word's vector from its subwords' vectors, chosen from one registry (`POOLINGS`).

Word vectors pool a word's subwords (first, last or mean subword); Tenney et al. 2019 ("What do you
learn from context?") use span pooling over such word vectors. Every pooling works on one batch's
flattened hidden states through a `PoolPlan`, a flat token -> word map, with index_select /
index_add (no per-word Python loop).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class PoolPlan:
    """Flat token -> word map of one batch (all indices into the (B*T,) flattened tokens).

    tok_idx: (M,) owned tokens; tok_word: (M,) their local word (0..W-1), non-decreasing;
    first_idx / last_idx: (W,) first / last subword of each word; counts: (W,) subwords per word.
    """

    tok_idx: torch.Tensor
    tok_word: torch.Tensor
    first_idx: torch.Tensor
    last_idx: torch.Tensor
    counts: torch.Tensor


def _pool_first(h: torch.Tensor, p: PoolPlan) -> torch.Tensor:
    """h: (B*T, D) -> (W, D), the first subword of each word (BERT's NER convention)."""
    return h.index_select(0, p.first_idx)


def _pool_last(h: torch.Tensor, p: PoolPlan) -> torch.Tensor:
    """(B*T, D) -> (W, D), the last subword (sees the whole word in a causal decoder)."""
    return h.index_select(0, p.last_idx)


def _pool_mean(h: torch.Tensor, p: PoolPlan) -> torch.Tensor:
    """(B*T, D) -> (W, D), mean over each word's subwords."""
    out = torch.zeros(len(p.counts), h.shape[1], dtype=h.dtype, device=h.device)
    out.index_add_(0, p.tok_word, h.index_select(0, p.tok_idx))
    return out / p.counts.unsqueeze(1).to(h.dtype)


POOLINGS: dict[str, Callable[[torch.Tensor, PoolPlan], torch.Tensor]] = {
    "first": _pool_first,
    "last": _pool_last,
    "mean": _pool_mean,
}
