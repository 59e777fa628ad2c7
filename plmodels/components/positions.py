"""Position helpers: rotary embeddings (RoPE) and ALiBi biases.

- RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding". Channel
  pairs (i, i + Dh/2) of q and k are rotated by the angle pos * theta_i with
  theta_i = base^(-2i/Dh) ("rotate-half" convention of GPT-NeoX / HF Llama):
  rope(x) = x * cos + rotate_half(x) * sin,  rotate_half([x1, x2]) = [-x2, x1].
- ALiBi: Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases". Head h adds
  -m_h * |i - j| to the attention score of query i and key j. For n heads (a power of two) the
  slopes are the geometric sequence m_h = 2^(-8 (h + 1) / n), h = 0..n-1; otherwise the slopes of
  the closest lower power of two 2^k followed by every other slope of 2^(k+1) (the paper's code).
  The encoder uses the symmetric |i - j|; under a causal mask only j <= i is seen, so the same
  bias gives the paper's decoder bias -m_h (i - j).
"""

from __future__ import annotations

import math

import torch


def rope_cos_sin(
    seq_len: int, head_dim: int, device: torch.device | None = None, base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (T, Dh), float32, for positions 0..T-1."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # (T, Dh): channel i and i + Dh/2 share an angle
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] on the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, H, T, Dh) by the (T, Dh) tables; computed in x's dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes m_h, (H,) float32 (Press et al. 2022, section 3)."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_distance(seq_len: int, device: torch.device | None = None) -> torch.Tensor:
    """-|i - j| as a (T, T) float32 matrix; multiply by a slope per head to get the ALiBi bias."""
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)
    return -(pos[:, None] - pos[None, :]).abs()
