"""Position helpers: rotary embeddings (RoPE), ALiBi biases, RoBERTa's position ids, sinusoids.

- RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding". Channel
  pairs (i, i + Dh/2) of q and k are rotated by the angle pos * theta_i with
  theta_i = base^(-2i/Dh) ("rotate-half" convention of GPT-NeoX / HF Llama):
  rope(x) = x * cos + rotate_half(x) * sin,  rotate_half([x1, x2]) = [-x2, x1].
  Partial rotary (GPT-NeoX, Black et al. 2022, "GPT-NeoX-20B"; Pythia rotates 25% of each head):
  the tables are built for R < Dh channels (theta_i = base^(-2i/R)) and only the first R channels
  of q and k are rotated; the rest carry no position.
- ALiBi: Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases". Head h adds
  -m_h * |i - j| to the attention score of query i and key j. For n heads (a power of two) the
  slopes are the geometric sequence m_h = 2^(-8 (h + 1) / n), h = 0..n-1; otherwise the slopes of
  the closest lower power of two 2^k followed by every other slope of 2^(k+1) (the paper's code).
  The encoder uses the symmetric |i - j|; under a causal mask only j <= i is seen, so the same
  bias gives the paper's decoder bias -m_h (i - j).
- RoBERTa's position ids (Liu et al. 2019; fairseq `utils.make_positions`, transformers'
  `RobertaEmbeddings.create_position_ids_from_input_ids`): a real token's id is pad_id + its rank
  among the non-[PAD] ids of its row (so the first real token gets pad_id + 1, on either side of the
  padding); a [PAD] gets pad_id. They are read from input_ids, not from an attention mask.
- Sinusoids (Vaswani et al. 2017, section 3.5), as a table that DistilBERT's `sinusoidal_pos_embds`
  stores in its learned-position matrix: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same).
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
    """Rotate x (B, H, T, Dh) by the (T, R) tables, R <= Dh and even; computed in x's dtype.

    R = Dh rotates every channel. R < Dh is partial rotary (GPT-NeoX's `rotary_pct`, Black et al.
    2022): the first R channels of each head are rotated as a head of size R (pairs (i, i + R/2)),
    the other Dh - R pass unchanged, as transformers' GPTNeoX `apply_rotary_pos_emb` does."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :rotary], x[..., rotary:]  # (B, H, T, R), (B, H, T, Dh - R)
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


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


def padding_position_ids(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """RoBERTa's position ids (B, T) int64: pad_id + cumsum(input_ids != pad_id) at real tokens, pad_id
    at [PAD] tokens (the same arithmetic as transformers' create_position_ids_from_input_ids)."""
    real = input_ids.ne(pad_id).int()
    return (torch.cumsum(real, dim=1).type_as(real) * real).long() + pad_id


def sinusoidal_table(n_positions: int, dim: int) -> torch.Tensor:
    """(n_positions, dim) float32 sinusoids, computed in float64: even channels 2i hold
    sin(p / 10000^(2i/dim)), odd channels 2i+1 cos of the same angle."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)
    angles = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), 2 * torch.div(j, 2, rounding_mode="floor") / dim)
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = angles[:, 0::2].sin()
    table[:, 1::2] = angles[:, 1::2].cos()
    return table.float()
