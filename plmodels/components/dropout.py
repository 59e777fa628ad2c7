"""Dropout (Srivastava et al. 2014) with a cheaper mask on the CPU.

Inverted dropout: in training each element is zeroed with probability p and the survivors are
scaled by 1 / (1 - p), so the expectation is unchanged; in eval it is the identity.

`torch.nn.Dropout` draws its mask with `bernoulli_`, one 32-bit random draw per element, which on
the CPU is the expensive part. A training step of the `mini` decoder draws 13 masks (embeddings,
4 x attention probabilities, 8 x residual branches, 17M elements), and the masks were ~8 % of the
step (docs/training.md, "Speed"). Here each 32-bit draw (`random_` on int32, uniform on [0, 2^31))
is split into two 15-bit uniform integers u, and an element is dropped when u < round(p 2^15): the
drop probability is p rounded to a multiple of 2^-15 (0.100006 for p = 0.1), and the scale uses that
same probability, so the expectation is exact. Forward and backward multiply by the same scaled
float mask; 2.2x faster than `F.dropout` for the attention probabilities of the mini shape.
Draws come from torch's global generator, so `torch.manual_seed` makes them reproducible.

On any other device the mask is torch's own (`F.dropout`, exact p): an accelerator's dropout
kernel draws and applies it in one pass, and `torch.compile` traces it, where the in-place
`random_` above breaks the graph at every dropout site (13 breaks in the tiny BERT forward: 14
separately compiled pieces and their backward, the masks drawn eagerly between them;
`torch._dynamo.explain`, tests/plmodels/test_dropout.py; issue 81: `compile` was slower than eager
on the GPU). On the CPU the breaks stay: there the compiled step with this mask was faster than
with F.dropout traced (1.07x, the mini encoder at dropout 0.1). The masks of the two devices
differ; each is reproducible from the global seed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

_BITS = 15  # bits per uniform integer: two per int32 draw (whose top bit is always 0)


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """A mask of `shape`: 0 with probability p' = round(p 2^15) / 2^15, else 1 / (1 - p')."""
    n = math.prod(shape)
    threshold = round(p * 2**_BITS)
    if not 0 <= threshold < 2**_BITS:
        raise ValueError(f"dropout probability must be in [0, 1 - 2^-16), got {p}")
    draws = torch.empty((n + 1) // 2, dtype=torch.int32, device=device).random_()
    u = draws.view(torch.int16)[:n].bitwise_and_(2**_BITS - 1).view(shape)  # uniform on [0, 2^15)
    return torch.where(u >= threshold, 2**_BITS / (2**_BITS - threshold), 0.0).to(dtype)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of x with drop probability p (identity when not training or p == 0): the
    15-bit mask above on the CPU, torch's `F.dropout` on any other device (module docstring)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    return x * dropout_mask(x.shape, p, dtype=x.dtype, device=x.device)


class Dropout(nn.Module):
    """Drop-in for `torch.nn.Dropout(p)` using `dropout` above (no parameters, no state)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
