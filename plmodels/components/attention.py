"""Multi-head self-attention: the kernel (two explicit paths) and the sub-layer with fused QKV.

Attention (Vaswani et al. 2017): for each head h,
    A_h = softmax(q_h k_h^T / sqrt(Dh) + M),   out_h = A_h v_h,
with M an additive mask (0 = attend, a very negative number = blocked) that also carries the
ALiBi bias. A head mask g (Michel et al. 2019, "Are Sixteen Heads Really Better than One?")
multiplies head h's probabilities, out_h = g_h A_h v_h, exactly as Hugging Face BERT applies
`head_mask`; its gradient dL/dg_h at g = 1 is Michel et al.'s head importance.

Two paths, chosen by the model and never silently swapped:
- `attention`: eager, returns the probabilities, honours the head mask and the pattern hook;
- `sdpa_attention`: `torch.nn.functional.scaled_dot_product_attention` (fused kernels, used for
  training). It cannot give probabilities or apply a head mask: asking for them is a ValueError.

`MultiHeadAttention.prune` removes heads for real (Michel et al. 2019): the rows of the fused QKV
projection and the columns of the output projection of those heads are cut out. When every head
of a layer is pruned the sub-layer outputs only the output projection's bias (zero if
`bias=False`) -- the same as gating all its heads to zero with the head mask.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .dropout import dropout
from .hooks import HookPoint
from .positions import alibi_slopes, apply_rope

AttnImpl = Literal["auto", "sdpa", "eager"]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    head_mask: torch.Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    edit_probs: Callable[[torch.Tensor], torch.Tensor] | None = None,
    edit_scores: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention. q, k, v: (B, H, T, Dh); mask: additive, broadcastable to (B, H, T, T);
    head_mask: (H,). Returns out (B, H, T, Dh) and probs (B, H, T, T), the probabilities that
    multiplied v (after dropout and head mask, as in HF BERT). `edit_scores` sees the scaled,
    masked scores before the softmax (the `attn.scores` hook site), `edit_probs` the post-softmax
    probabilities (the `attn.pattern` hook site)."""
    # q is scaled before the product (B H T Dh elements instead of B H T T; the product needs a
    # contiguous copy of the permuted q anyway), and the mask is added in place: the matmul's
    # backward needs q and k, not its output, so this is autograd-safe.
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, H, T, T)
    if mask is not None:
        in_place = torch.broadcast_shapes(scores.shape, mask.shape) == scores.shape and mask.dtype == scores.dtype
        scores = scores.add_(mask) if in_place else scores + mask
    if edit_scores is not None:
        scores = edit_scores(scores)
    if scores.requires_grad:
        probs = scores.softmax(dim=-1)
    elif torch.is_autocast_enabled(scores.device.type):  # no autograd, autocast (bf16 extraction): float32
        probs = scores.softmax(dim=-1, dtype=torch.float32)  # probabilities, 2x faster than bf16's on CPU
    elif edit_scores is None:  # no autograd (extraction, inference_mode): softmax over the scores' own memory
        probs = torch._softmax(scores, -1, False, out=scores)
    else:  # a scores hook may have kept the tensor (run_with_cache, a patching cache): leave it the scores
        probs = scores.softmax(dim=-1)
    if edit_probs is not None:
        probs = edit_probs(probs)
    if dropout_p > 0.0:
        probs = dropout(probs, dropout_p)
    if head_mask is not None:
        probs = probs * head_mask.to(probs.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1) broadcast
    return probs @ v, probs


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Fused attention, (B, H, T, Dh) -> (B, H, T, Dh); mask additive in q's dtype or None.

    Two CPU cases go to the eager `attention` above, which computes the same function:
    - dropout: PyTorch has no fused CPU kernel and falls back to its math path, which draws the mask
      with bernoulli_; eager uses the cheaper mask of dropout.py (fwd + bwd of one mini-shape layer:
      47 ms against 58-82 ms);
    - bfloat16 (training under bf16 autocast): the CPU flash kernel's backward is slow in bf16; fwd +
      bwd at 64 x 4 heads x 128 x 64 took 95 ms against 25 ms eager (bf16 matmuls, bf16 softmax) on an
      AVX512-BF16 CPU, where fp32 SDPA took 60 ms (benchmarks: docs/training.md, "Speed")."""
    if q.device.type == "cpu" and (dropout_p > 0.0 or q.dtype == torch.bfloat16):
        if is_causal:  # the mask is_causal stands for, materialised for the eager path
            causal = additive_mask(keep_mask(None, q.shape[-2], q.device, causal=True, explicit=True)[0], None, q.dtype)
            mask = causal if mask is None else mask + causal
        return attention(q, k, v, mask, dropout_p=dropout_p)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)


def resolve_attn_impl(attn_impl: str, *, output_attentions: bool, head_mask, pattern_hooks: bool) -> bool:
    """True for the eager path. "auto" goes eager only when something needs it; "sdpa" refuses."""
    if attn_impl not in ("auto", "sdpa", "eager"):
        raise ValueError(f"attn_impl must be 'auto', 'sdpa' or 'eager', got {attn_impl!r}")
    needs = [
        what
        for what, asked in (
            ("output_attentions=True", output_attentions),
            ("a head_mask", head_mask is not None),
            ("an attn.pattern hook", pattern_hooks),
        )
        if asked
    ]
    if attn_impl == "sdpa" and needs:
        raise ValueError(
            f"attn_impl='sdpa' cannot honour {', '.join(needs)} (only the eager path gives "
            "probabilities and head masks); use attn_impl='eager' or 'auto'"
        )
    return attn_impl == "eager" or bool(needs)


def keep_mask(
    attention_mask: torch.Tensor | None, seq_len: int, device: torch.device, *, causal: bool, explicit: bool
) -> tuple[torch.Tensor | None, bool]:
    """Boolean "may attend" mask broadcastable to (B, 1, T, T), and whether to use is_causal instead.

    attention_mask: (B, T), 1 = real token. `explicit` forces a materialised causal mask (eager
    path, ALiBi); otherwise a purely causal mask is left to SDPA's is_causal (fastest kernels).
    """
    pad = None if attention_mask is None else attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
    if not causal:
        return pad, False
    if pad is None and not explicit:
        return None, True
    tril = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]  # (1, 1, T, T)
    return (tril if pad is None else tril & pad), False


def additive_mask(keep: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype):
    """0 where keep, finfo(dtype).min where blocked (finite: fully blocked rows give no NaN), + bias."""
    if keep is None:
        return None if bias is None else bias.to(dtype)
    mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, torch.finfo(dtype).min)
    return mask if bias is None else mask + bias.to(dtype)


class Packing:
    """The real (non-padding) tokens of a padded (B, T) batch, so that the position-wise layers
    (projections, MLP, LayerNorm) run on those N tokens only; attention scatters them back into the
    padded (B, T) layout. With length-sorted batches ~10% of the tokens are padding (unpadding, as
    in Geiping & Goldstein 2022, "Cramming"). rows: (N,) flat indices b T + t of the real tokens."""

    def __init__(self, attention_mask: torch.Tensor) -> None:
        self.batch, self.length = attention_mask.shape
        real = attention_mask.flatten().bool()
        self.rows = real.nonzero().squeeze(1)  # (N,)
        self.pad_rows = (~real).nonzero().squeeze(1)  # (B T - N,)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.rows)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at the padding (only the padding rows are zeroed: attention
        multiplies them by probability 0, which must not meet a NaN from uninitialised memory)."""
        out = x.new_empty(self.batch * self.length, *x.shape[1:]).index_copy_(0, self.rows, x)
        out.index_fill_(0, self.pad_rows, 0.0)
        return out.view(self.batch, self.length, *x.shape[1:])


class MultiHeadAttention(nn.Module):
    """Self-attention sub-layer: fused QKV projection (one Linear D -> 3 H Dh), optional RoPE on
    q and k, optional ALiBi bias, output projection H Dh -> D. Hook sites: `q`, `k`, `v` (B, T, H, Dh;
    q and k after RoPE), `scores` (B, H, T, T, scaled and masked, before the softmax; eager path),
    `pattern`, `head_out`."""

    def __init__(self, d_model: int, n_heads: int, *, bias: bool, dropout: float, position: str) -> None:
        super().__init__()
        self.d_model, self.head_dim, self.dropout, self.position = d_model, d_model // n_heads, dropout, position
        self.head_ids: list[int] = list(range(n_heads))  # original ids of the heads still present
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        if position == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(n_heads), persistent=False)
        self.q, self.k, self.v = HookPoint(), HookPoint(), HookPoint()
        self.scores = HookPoint()
        self.pattern = HookPoint()
        self.head_out = HookPoint()

    @property
    def n_heads(self) -> int:
        return len(self.head_ids)

    def forward(
        self,
        x: torch.Tensor,
        keep: torch.Tensor | None = None,
        *,
        is_causal: bool = False,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        alibi_dist: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        eager: bool = False,
        packing: Packing | None = None,
        query_index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D) -> (out (B, T, D), probs (B, H, T, T) on the eager path else None).

        keep: bool (B|1, 1, T, T) may-attend mask; head_mask: (H_original,), entries of pruned heads
        are ignored. With `packing`, x and out are the (N, D) real tokens only. With `query_index`
        (B, Q) positions, only those rows are queries: keys and values are still every position, and
        out is (B, Q, D), row j of sequence b the output at position query_index[b, j]."""
        if query_index is not None and (packing is not None or is_causal):
            raise ValueError("query_index cannot be combined with packing or is_causal (pass a causal `keep`)")
        B, T = (packing.batch, packing.length) if packing is not None else x.shape[:2]
        H, Dh = self.n_heads, self.head_dim
        if H == 0:  # every head pruned: nothing to attend with, only the output bias remains
            rows = x.shape[:-1] if query_index is None else query_index.shape
            out = x.new_zeros(*rows, self.d_model)
            out = out if self.out.bias is None else out + self.out.bias
            return out, (x.new_zeros(B, 0, T, T) if eager else None)
        qkv = self.qkv(x)  # (B, T, 3 D) or packed (N, 3 D)
        qkv = (packing.pad(qkv) if packing is not None else qkv).view(B, T, 3, H, Dh)  # (B, T, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, Dh)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.q.fns or self.k.fns or self.v.fns:  # sites in (B, T, H, Dh), TransformerLens' layout
            q, k, v = (site(t.transpose(1, 2)).transpose(1, 2) for site, t in ((self.q, q), (self.k, k), (self.v, v)))
        bias = None
        if alibi_dist is not None:
            bias = self.alibi_slopes.view(H, 1, 1) * alibi_dist  # (H, T, T)
        if query_index is not None:  # keep the query rows asked for: T -> Q
            Q = query_index.shape[1]
            q = q.gather(2, query_index[:, None, :, None].expand(B, H, Q, Dh))  # (B, H, Q, Dh)
            bias = None if bias is None else bias[:, query_index].transpose(0, 1)  # (B, H, Q, T)
            if keep is not None and keep.shape[2] != 1:  # a mask with a row per query: its rows
                keep = keep.expand(B, 1, T, T).gather(2, query_index[:, None, :, None].expand(B, 1, Q, T))
            T = Q  # the output has Q rows
        mask = additive_mask(keep, bias, q.dtype)  # (B|1, H|1, T|Q, T) or None
        p = self.dropout if self.training else 0.0
        if eager:
            if head_mask is not None and len(self.head_ids) != head_mask.shape[0]:
                head_mask = head_mask[self.head_ids]  # (H,) original ids -> present heads
            edit = self.pattern if self.pattern.fns else None
            y, probs = attention(q, k, v, mask, head_mask, dropout_p=p, edit_probs=edit,
                                 edit_scores=self.scores if self.scores.fns else None)
        else:
            if head_mask is not None:
                raise ValueError("the SDPA path cannot apply a head mask; use the eager path")
            y, probs = sdpa_attention(q, k, v, mask, is_causal=is_causal, dropout_p=p), None
        y = self.head_out(y.transpose(1, 2)).reshape(B, T, H * Dh)  # (B, T, H, Dh) -> (B, T, H Dh)
        if packing is not None:
            y = packing.pack(y)  # (N, H Dh)
        return self.out(y), probs  # -> (B, T, D) or (N, D)

    @torch.no_grad()
    def prune(self, heads: list[int]) -> None:
        """Remove the heads with these *original* ids: cut their QKV rows and output columns."""
        missing = [h for h in heads if h not in self.head_ids]
        if missing:
            raise ValueError(f"heads {missing} are not present (present: {self.head_ids})")
        H, Dh = self.n_heads, self.head_dim
        kept = [i for i, h in enumerate(self.head_ids) if h not in heads]  # positions in current layout
        dims = torch.tensor([i * Dh + j for i in kept for j in range(Dh)], dtype=torch.long)
        rows = torch.cat([part * H * Dh + dims for part in range(3)])  # q, k, v blocks of the fused weight
        self.qkv = _sliced_linear(self.qkv, rows, dim=0)
        self.out = _sliced_linear(self.out, dims, dim=1)
        if self.position == "alibi":
            self.alibi_slopes = self.alibi_slopes[kept].clone()
        self.head_ids = [self.head_ids[i] for i in kept]


def _sliced_linear(layer: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping `index` along the weight's dim 0 (outputs) or dim 1 (inputs)."""
    w = layer.weight
    index = index.to(w.device)
    weight = w.index_select(dim, index).clone()
    has_bias = layer.bias is not None
    with warnings.catch_warnings():  # a zero-head layer: "Initializing zero-element tensors is a no-op"
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    new.weight.copy_(weight)
    if has_bias:
        new.bias.copy_(layer.bias if dim == 1 else layer.bias.index_select(0, index))
    new.weight.requires_grad_(w.requires_grad)
    return new


class CrossAttention(nn.Module):
    """Attention of queries from x over keys and values from a `memory` (Vaswani et al. 2017's
    encoder-decoder attention): projections q_proj D -> H Dh and kv_proj D -> 2 H Dh (rows [k; v]),
    output projection H Dh -> D. Self-attention is the case memory = x; the encoder-decoder models
    (seq2seq.py) use it there too, because T5 adds a relative position bias to the scores, for which
    `MultiHeadAttention` has no input. An additive `bias` broadcastable to (B, H, Tq, Tk) is added to
    the scores together with the mask. `scale=False` leaves q k^T unscaled (T5 folds 1/sqrt(Dh) into
    its init): q is multiplied by sqrt(Dh) before the kernel divides by it (equal up to rounding).
    Hook sites as MultiHeadAttention's: `q` (B, Tq, H, Dh), `k`, `v` (B, Tk, H, Dh), `scores`,
    `pattern` (B, H, Tq, Tk; eager path) and `head_out` (B, Tq, H, Dh). No head pruning."""

    def __init__(self, d_model: int, n_heads: int, *, bias: bool, dropout: float, scale: bool = True) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.dropout, self.scale = n_heads, d_model // n_heads, dropout, scale
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.q, self.k, self.v = HookPoint(), HookPoint(), HookPoint()
        self.scores = HookPoint()
        self.pattern = HookPoint()
        self.head_out = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        keep: torch.Tensor | None = None,
        *,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        eager: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, Tq, D), memory (B, Tk, D) -> (out (B, Tq, D), probs (B, H, Tq, Tk) on the eager path
        else None). keep: bool may-attend mask broadcastable to (B, 1, Tq, Tk); head_mask: (H,)."""
        B, Tq, _ = x.shape
        Tk, H, Dh = memory.shape[1], self.n_heads, self.head_dim
        q = self.q_proj(x).view(B, Tq, H, Dh).transpose(1, 2)  # (B, H, Tq, Dh)
        kv = self.kv_proj(memory).view(B, Tk, 2, H, Dh)  # (B, Tk, 2, H, Dh)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, Tk, Dh)
        if self.q.fns or self.k.fns or self.v.fns:  # sites in (B, T, H, Dh), TransformerLens' layout
            q, k, v = (site(t.transpose(1, 2)).transpose(1, 2) for site, t in ((self.q, q), (self.k, k), (self.v, v)))
        if not self.scale:
            q = q * math.sqrt(Dh)  # the kernels divide by sqrt(Dh): net q k^T unscaled
        mask = additive_mask(keep, bias, q.dtype)  # (B|1, H|1, Tq, Tk) or None
        p = self.dropout if self.training else 0.0
        if eager:
            y, probs = attention(q, k, v, mask, head_mask, dropout_p=p,
                                 edit_probs=self.pattern if self.pattern.fns else None,
                                 edit_scores=self.scores if self.scores.fns else None)
        else:
            if head_mask is not None:
                raise ValueError("the SDPA path cannot apply a head mask; use the eager path")
            y, probs = sdpa_attention(q, k, v, mask, is_causal=is_causal, dropout_p=p), None
        y = self.head_out(y.transpose(1, 2)).reshape(B, Tq, H * Dh)  # (B, Tq, H, Dh) -> (B, Tq, H Dh)
        return self.out(y), probs
