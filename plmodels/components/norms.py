"""Value-vector norms of attention heads: Kobayashi, Kuribayashi, Yokoi & Inui 2020, "Attention is
Not Only a Weight: Analyzing Transformers with Vector Norms" (EMNLP).

Head h of a layer writes at position i

    sum_j alpha_ij f_h(x_j),   f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h,

the value vector of token j (the `attn.v` hook site, bias b_V included) times head h's slice of the
output projection (columns h Dh:(h+1) Dh of `attn.out.weight`); the sub-layer output is the sum
over heads plus the output bias b_O, which belongs to no head and so to no f_h. Kobayashi et al.
read ||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)|| instead of alpha_ij alone: a weight on a token
whose transformed vector is tiny moves the output little (BERT's large weights on [CLS], [SEP] and
punctuation shrink under this view, their Sec. 5).

- `head_value_norms(v, attn)`: ||f_h(x_j)|| (B, H, T) from one layer's value vectors;
- `record_value_norms(model)`: a context manager that fills, for every forward pass inside it,
  each layer's (B, H_l, T) norms through hooks on the `blocks.{l}.attn.v` sites.

Heads are in the layer's *present* order (`attn.head_ids`, after pruning), the order of the head
axis of the probabilities the model returns, so the two multiply element-wise. The v site sees the
padded (B, T, H, Dh) layout also under `unpad=True` (attention re-pads the packed QKV projection
before it splits heads); padding positions carry zero value vectors there, hence norm 0.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from .attention import MultiHeadAttention


def head_value_norms(v: torch.Tensor, attn: MultiHeadAttention) -> torch.Tensor:
    """||f_h(x_j)|| for every head h and position j: v (B, T, H, Dh), the `attn.v` site of `attn`
    (bias b_V included) -> (B, H, T) float32. f_h(x_j) = v_jh W_O[:, h Dh:(h+1) Dh]^T, one head at
    a time so that memory stays at one (B, T, D) product whatever the number of heads."""
    B, T, H, Dh = v.shape
    W = attn.out.weight.float()  # (D, H Dh): Linear computes y W^T
    if W.shape[1] != H * Dh:
        raise ValueError(f"value vectors have {H} heads x {Dh} but the output projection takes {W.shape[1]} inputs")
    v = v.float()
    out = v.new_empty(B, H, T)
    for h in range(H):
        f = v[:, :, h] @ W[:, h * Dh:(h + 1) * Dh].T  # (B, T, Dh) @ (Dh, D) -> (B, T, D)
        out[:, h] = torch.linalg.vector_norm(f, dim=-1)
    return out


@contextmanager
def record_value_norms(model: Any) -> Iterator[list[torch.Tensor | None]]:
    """Record Kobayashi et al.'s ||f_h(x_j)|| during the forward passes run inside the block.

    Yields `norms`, a list with one entry per layer: after a forward pass norms[l] is layer l's
    (B, H_l, T) float32 tensor (heads in present order, as the returned probabilities), or None for
    a layer whose heads are all pruned (its attention never reaches the v site). A later pass
    overwrites the entries. `model` is any family with `blocks[l].attn` (a `MultiHeadAttention`)
    and the hook sites `blocks.{l}.attn.v`; the hooks are removed when the block exits.
    """
    blocks = model.blocks
    norms: list[torch.Tensor | None] = [None] * len(blocks)

    def recorder(l: int, attn: MultiHeadAttention):
        def fn(v: torch.Tensor, name: str) -> None:
            norms[l] = head_value_norms(v.detach(), attn)
        return fn

    with model.hooks(fwd=[(f"blocks.{l}.attn.v", recorder(l, b.attn)) for l, b in enumerate(blocks)]):
        yield norms
