"""Span pooling operators for edge probing (Tenney et al. 2019a, "What do you learn from context?").

A span of W token vectors h_1..h_W (padded to the batch's longest span, with a boolean mask) is
reduced to a fixed-size vector. Every pooler works on h of shape (B, W, *F) and mask (B, W) and
returns `pieces` of shape (B, P, *F); `forward` flattens them to (B, P * F) for 2-D F = (d,).

- mean:      (1/W) sum_t h_t
- max:       max_t h_t (elementwise)
- last:      h_W, the span's last token (for decoders, whose tokens see only left context)
- endpoint:  [h_1; h_W] (P = 2)
- self_attn: sum_t alpha_t h_t, alpha = softmax_t(w . h_t + b) over the real tokens only
             (Lee et al. 2017, "End-to-end neural coreference resolution", as used by Tenney)

Poolers marked `linear = True` commute with any per-token affine map A: pool(A h) = A pool(h) piece
by piece. The edge probe uses this to pool raw vectors *before* the scalar mix and projection (same
result, much less work). Choose by name from `POOLERS` via `make_pooler`.
"""
from __future__ import annotations

import torch
from torch import nn


def _expand_mask(mask: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """(B, W) -> (B, W, 1, ..., 1) matching h's rank."""
    return mask.reshape(mask.shape + (1,) * (h.dim() - 2))


def _last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each span, (B,) long. Spans are left-aligned."""
    return mask.sum(dim=1).long() - 1


class Pooler(nn.Module):
    """Base class: subclasses define `pieces(h, mask) -> (B, P, *F)`."""

    n_pieces: int = 1
    linear: bool = True

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    @property
    def out_dim(self) -> int:
        return self.n_pieces * self.dim

    def pieces(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pieces(h, mask).flatten(1)  # (B, P * d)


class MeanPooler(Pooler):
    def pieces(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = _expand_mask(mask, h).to(h.dtype)
        return ((h * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)).unsqueeze(1)


class MaxPooler(Pooler):
    linear = False  # max does not commute with a projection

    def pieces(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return h.masked_fill(~_expand_mask(mask, h), float("-inf")).amax(dim=1).unsqueeze(1)


class LastPooler(Pooler):
    def pieces(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(h.shape[0], device=h.device)
        return h[rows, _last_index(mask)].unsqueeze(1)


class EndpointPooler(Pooler):
    n_pieces = 2

    def pieces(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(h.shape[0], device=h.device)
        return torch.stack([h[:, 0], h[rows, _last_index(mask)]], dim=1)


class SelfAttentivePooler(Pooler):
    """alpha_t = softmax_t(w . h_t + b) over real tokens; output sum_t alpha_t h_t (Lee et al. 2017)."""

    linear = False

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.score = nn.Linear(dim, 1)

    def attention_weights(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """alpha, (B, W): sums to 1 over each span's real tokens, exactly 0 on padding. h: (B, W, d)."""
        logits = self.score(h).squeeze(-1).masked_fill(~mask, float("-inf"))  # (B, W)
        return torch.softmax(logits, dim=1)

    def pieces(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        alpha = self.attention_weights(h, mask)
        return torch.einsum("bw,bwd->bd", alpha, h).unsqueeze(1)  # (B, 1, d)


POOLERS: dict[str, type[Pooler]] = {
    "mean": MeanPooler,
    "max": MaxPooler,
    "last": LastPooler,
    "endpoint": EndpointPooler,
    "self_attn": SelfAttentivePooler,
}


def make_pooler(name: str, dim: int) -> Pooler:
    """Build the pooler registered under `name` for token vectors of width `dim`."""
    if name not in POOLERS:
        raise ValueError(f"pooling={name!r} is unknown; choose one of {sorted(POOLERS)}")
    return POOLERS[name](dim)
