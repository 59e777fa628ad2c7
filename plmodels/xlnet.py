"""XLNet: two-stream self-attention with relative positions, for permutation language modelling.

Yang et al. 2019, "XLNet: Generalized Autoregressive Pretraining for Language Understanding"
(NeurIPS), as the authors' zihangdai/xlnet (modeling.py) and Hugging Face's modeling_xlnet.py
compute it; weights import in hf/xlnet.py, the permutation batch is training/plm.py.

Reading order: config -> relative positional encoding -> attention -> block -> model.

- Two streams share every weight (Sec. 2.3, Eq. 4). The content stream h (initialised with the
  word embeddings) is an ordinary bidirectional encoder restricted by the factorisation order:
  h_i^(m) = Attention(Q = h_i^(m-1), KV = h_{z<=t}^(m-1)), so position i sees itself and what comes
  before it. The query stream g (initialised with one learned vector, `mask_emb`, at each target)
  sees the content of z<t only, never its own token: g_i^(m) = Attention(Q = g_i^(m-1),
  KV = h_{z<t}^(m-1)). The target's logits are e(x)^T g_i^(L) + b (Eq. 3), with the word embeddings
  tied to the output layer. `perm_mask` (B, T, T), 1 = i may not see j, is the query stream's mask;
  the content stream's is the same with the diagonal cleared (HF's `non_tgt_mask`).
- Relative positional encoding of Transformer-XL (Dai et al. 2019, Sec. 3.3), with XLNet's relative
  segment encoding (Sec. 2.5): for query i and key j,
      score_ij = [(q_i + u)^T k_j + (q_i + v)^T W_r R_{i-j} + (q_i + b)^T s_ij] / sqrt(Dh),
  u = `r_w_bias`, v = `r_r_bias`, b = `r_s_bias`, R the sinusoid of the distance i - j (clamped to
  `clamp_len` when > 0), s_ij = `seg_embed`[token_type_i != token_type_j] (the segment term only when
  token_type_ids are given). Masked scores get -1e30 added, as the authors' code (so a query that
  may see nothing attends uniformly, as there). The authors compute (q + v)^T W_r R for 2T
  distances and `rel_shift` it into place; here the same products are gathered at index T - i + j.
- Post-LN blocks: h <- LN(h + Dropout(attn W_o)); h <- LN(h + Dropout(W_2 Dropout(act(W_1 h)))),
  applied to each stream with the same weights. Projections have no bias, the FFN has.
- `bi_data` (pretraining): the batch's second half reads the distances negated (a backward
  encoding); `attn_type="uni"` adds a causal mask.

The query stream is computed at the target positions only: target_mapping (B, P, T) must have
one-hot rows (or zero rows, padding: their attention output is zero, as in HF), one per position.
HF instead maps the queries onto all T positions and back; the results are the same.

Hook sites: `embed` (content stream input, (B, T, D)), `blocks.{l}.attn.pattern` (content
probabilities, (B, H, T, T)), `blocks.{l}.attn.query_pattern` ((B, H, P, T)), `blocks.{l}.resid_post`
(content, (B, T, D)) and `blocks.{l}.query_resid_post` ((B, P, D)). The pattern sites are eager only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from plmodels.config import Config

from .components.attention import attention, resolve_attn_impl, sdpa_attention
from .components.dropout import Dropout
from .components.hooks import HookedModel, HookPoint
from .components.layers import ACTIVATIONS, init_weights
from .components.model_config import config_from_dict
from .components.outputs import EncoderOutput


@dataclass(frozen=True)
class XLNetConfig(Config):
    vocab_size: int = 32000  # number of token ids (XLNet's SentencePiece vocabulary)
    d_model: int = 768  # width D
    n_layers: int = 12  # blocks L
    n_heads: int = 12  # heads H; divides d_model
    d_ff: int = 3072  # FFN hidden width (HF's d_inner)
    dropout: float = 0.1  # hidden, attention and positional-encoding dropout
    layer_norm_eps: float = 1e-12  # LayerNorm epsilon
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"  # FFN activation (HF's ff_activation)
    bi_data: bool = False  # second half of the batch reads backward relative positions
    clamp_len: int = -1  # clamp |i - j| to this when > 0
    attn_type: Literal["bi", "uni"] = "bi"  # bidirectional, or with a causal mask added
    max_positions: int = 512  # longest input the workbench feeds (no table limits it: positions are relative)

    def __post_init__(self) -> None:
        name = type(self).__name__
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}.{key} must be an int >= 1, got {value!r}")
        if self.d_model % self.n_heads or self.d_model % 2:
            raise ValueError(f"{name}: d_model={self.d_model} must be even and divisible by n_heads={self.n_heads}")
        for key, allowed in (("activation", tuple(ACTIVATIONS)), ("attn_type", ("bi", "uni"))):
            if getattr(self, key) not in allowed:
                raise ValueError(f"{name}.{key} must be one of {allowed}, got {getattr(self, key)!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{name}.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"{name}.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> "XLNetConfig":
        return config_from_dict(cls, d, source)


@dataclass
class XLNetOutput:
    """What `XLNet.forward` returns.

    logits: (B, P, V) from the query stream at the targets when target_mapping is given, else (B, T, V)
    from the content stream; None when `return_logits=False`. last_hidden_state: (B, T, D) content
    stream output; query_hidden_state: (B, P, D) query stream output or None (both after the final
    dropout, as HF's output). hidden_states: the content stream's L + 1 (B, T, D) (embedding, then each
    block) or None. attentions: L content-stream probabilities (B, H, T, T) (head mask applied) or None.
    """

    logits: torch.Tensor | None
    last_hidden_state: torch.Tensor
    query_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def relative_positional_encoding(T: int, cfg: XLNetConfig, batch: int, device: torch.device) -> torch.Tensor:
    """Sinusoids of the distances T, T-1, ..., 1-T (row r: distance T - r) -> (1, 2T, D), or (B, 2T, D)
    with `bi_data` (first half of the batch forward, second half the distances negated)."""
    inv_freq = 1.0 / torch.pow(10000, torch.arange(0, cfg.d_model, 2, device=device).float() / cfg.d_model)  # (D/2,)

    def sinusoid(dist: torch.Tensor) -> torch.Tensor:
        if cfg.clamp_len > 0:
            dist = dist.clamp(-cfg.clamp_len, cfg.clamp_len)
        angle = dist[:, None] * inv_freq  # (2T, D/2)
        return torch.cat([angle.sin(), angle.cos()], dim=-1)  # (2T, D)

    fwd = sinusoid(torch.arange(T, -T, -1, device=device).float())
    if not cfg.bi_data:
        return fwd[None]
    if batch % 2:
        raise ValueError(f"bi_data needs an even batch size, got {batch}")
    bwd = sinusoid(torch.arange(-T, T, 1, device=device).float())
    return torch.cat([fwd[None].expand(batch // 2, -1, -1), bwd[None].expand(batch // 2, -1, -1)])


class RelativeAttention(nn.Module):
    """One attention sub-layer's weights, applied to either stream (Transformer-XL's relative scores,
    XLNet's segment term). Projections W_q, W_k, W_v, W_r, W_o have no bias (HF's q, k, v, r, o)."""

    def __init__(self, cfg: XLNetConfig) -> None:
        super().__init__()
        D, H = cfg.d_model, cfg.n_heads
        self.n_heads, self.head_dim, self.dropout = H, D // H, cfg.dropout
        self.q, self.k, self.v, self.r = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.o = nn.Linear(D, D, bias=False)
        self.r_w_bias = nn.Parameter(torch.zeros(H, D // H))  # u: content bias
        self.r_r_bias = nn.Parameter(torch.zeros(H, D // H))  # v: position bias
        self.r_s_bias = nn.Parameter(torch.zeros(H, D // H))  # b: segment bias
        self.seg_embed = nn.Parameter(torch.zeros(2, H, D // H))  # s: [same segment, different segment]
        self.pattern = HookPoint()  # content stream probabilities (B, H, T, T)
        self.query_pattern = HookPoint()  # query stream probabilities (B, H, P, T)

    def heads(self, proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return proj(x).view(*x.shape[:-1], self.n_heads, self.head_dim)  # (..., T, H, Dh)

    def forward(self, x, k, v, k_r, q_pos, seg_diff, blocked, *, query: bool, head_mask=None, eager=False):
        """x (B, Tq, D) the stream's queries at positions q_pos (B|1, Tq); k, v (B, H, T, Dh) from the
        content stream; k_r (B|1, 2T, H, Dh) the projected distances; seg_diff (B, Tq, T) bool or None;
        blocked (B, 1, Tq, T) bool or None. -> out (B, Tq, D) before W_o's residual, probs or None."""
        B, Tq, T = x.shape[0], x.shape[1], k.shape[2]
        q = self.heads(self.q, x)  # (B, Tq, H, Dh)
        bd = torch.einsum("bihd,bjhd->bhij", q + self.r_r_bias, k_r.expand(B, -1, -1, -1))  # (B, H, Tq, 2T)
        index = T - q_pos[:, :, None] + torch.arange(T, device=x.device)  # (B|1, Tq, T): row of distance i - j
        bd = bd.gather(3, index[:, None].expand(B, self.n_heads, Tq, T))  # (B, H, Tq, T)
        if seg_diff is not None:
            ef = torch.einsum("bihd,shd->bhis", q + self.r_s_bias, self.seg_embed)  # (B, H, Tq, 2)
            bd = bd + torch.where(seg_diff[:, None], ef[..., 1:], ef[..., :1])  # (B, H, Tq, T)
        bias = bd * self.head_dim ** -0.5
        if blocked is not None:  # the authors' score - 1e30 * mask (65500 in fp16)
            bias = bias - (65500.0 if bias.dtype == torch.float16 else 1e30) * blocked.to(bias.dtype)
        qu = (q + self.r_w_bias).transpose(1, 2)  # (B, H, Tq, Dh); the kernel adds (q + u) k^T / sqrt(Dh)
        p = self.dropout if self.training else 0.0
        site = self.query_pattern if query else self.pattern
        if eager:
            y, probs = attention(qu, k, v, bias, head_mask, dropout_p=p, edit_probs=site if site.fns else None)
        else:
            if head_mask is not None:
                raise ValueError("the SDPA path cannot apply a head mask; use the eager path")
            y, probs = sdpa_attention(qu, k, v, bias, dropout_p=p), None
        return y.transpose(1, 2).reshape(B, Tq, -1), probs  # (B, Tq, H Dh)


class Block(nn.Module):
    """Post-LN block run on the content stream, then (same weights) on the query stream."""

    def __init__(self, cfg: XLNetConfig) -> None:
        super().__init__()
        self.attn = RelativeAttention(cfg)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)  # HF's rel_attn.layer_norm
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_ff)  # HF's ff.layer_1
        self.fc_out = nn.Linear(cfg.d_ff, cfg.d_model)  # HF's ff.layer_2
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)  # HF's ff.layer_norm
        self.act = ACTIVATIONS[cfg.activation]
        self.drop = Dropout(cfg.dropout)
        self.resid_post = HookPoint()  # content stream output (B, T, D)
        self.query_resid_post = HookPoint()  # query stream output (B, P, D)

    def sublayers(self, x: torch.Tensor, attn_vec: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn.o(attn_vec)))
        return self.norm2(x + self.drop(self.fc_out(self.drop(self.act(self.fc_in(x))))))

    def forward(self, h, g, k_r, content, query, *, head_mask=None, eager=False):
        """content / query: (q_pos, seg_diff, blocked) per stream (query also `present` (B, P, 1))."""
        k, v = (self.attn.heads(p, h).transpose(1, 2) for p in (self.attn.k, self.attn.v))  # (B, H, T, Dh)
        vec, probs = self.attn(h, k, v, k_r, *content, query=False, head_mask=head_mask, eager=eager)
        if g is not None:
            q_pos, seg_diff, blocked, present = query
            vec_g, _ = self.attn(g, k, v, k_r, q_pos, seg_diff, blocked, query=True, head_mask=head_mask, eager=eager)
            g = self.query_resid_post(self.sublayers(g, vec_g * present.to(vec_g.dtype)))
        return self.resid_post(self.sublayers(h, vec)), g, probs


class XLNet(HookedModel, nn.Module):
    """XLNet with its tied LM head. forward(input_ids (B, T), ...) -> XLNetOutput."""

    kind = "xlnet"

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        cfg = self.config = config
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)  # also the output layer (tied)
        self.mask_emb = nn.Parameter(torch.zeros(1, 1, cfg.d_model))  # g^(0): the query stream's input w
        self.drop = Dropout(cfg.dropout)
        self.embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))  # HF's lm_loss.bias
        self.apply(init_weights)  # N(0, 0.02), as HF's initializer_range; the raw parameters below too
        for name, p in self.named_parameters():
            if name == "mask_emb" or name.endswith(("r_w_bias", "r_r_bias", "r_s_bias", "seg_embed")):
                nn.init.normal_(p, 0.0, 0.02)
        self.name_hook_points()
        self._query_points = [b.attn.query_pattern for b in self.blocks]

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [block.attn.n_heads for block in self.blocks]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        head_mask: torch.Tensor | None = None,
        attn_impl: str = "auto",
        unpad: bool = False,
        return_logits: bool = True,
        check_targets: bool = True,
    ) -> XLNetOutput:
        """attention_mask (B, T) 1 = real token; perm_mask (B, T, T) 1 = i may not see j; target_mapping
        (B, P, T) one-hot rows at the P targets (training/plm.py's `permutation_batch` makes both);
        token_type_ids (B, T) segments; head_mask (L, H) on both streams. `unpad` zeroes the content
        outputs at the padding (the padded tokens are computed and dropped). `check_targets` checks
        that target_mapping's rows are one-hot, which reads its values back to the host (on CUDA, a
        wait for the queue); the trainer, whose `permutation_batch` built them so, turns it off."""
        cfg, (B, T), dev = self.config, input_ids.shape, input_ids.device
        if head_mask is not None and tuple(head_mask.shape) != (cfg.n_layers, cfg.n_heads):
            raise ValueError(f"head_mask must be (n_layers, n_heads)={(cfg.n_layers, cfg.n_heads)}, "
                             f"got {tuple(head_mask.shape)}")
        hooks = self._pattern_hooks_active() or any(p.fns for p in self._query_points)
        eager = resolve_attn_impl(attn_impl, output_attentions=output_attentions, head_mask=head_mask,
                                  pattern_hooks=hooks)
        blocked = self._blocked(attention_mask, perm_mask, B, T, dev)  # (B, 1, T, T): the query stream's
        eye = torch.eye(T, dtype=torch.bool, device=dev)
        positions = torch.arange(T, device=dev)[None]  # (1, T)
        seg_diff = None if token_type_ids is None else token_type_ids[:, :, None] != token_type_ids[:, None, :]
        content = (positions, seg_diff, None if blocked is None else blocked & ~eye)  # a token sees itself

        h = self.embed(self.drop(self.word_embedding(input_ids)))  # (B, T, D)
        g, query = None, None
        if target_mapping is not None:
            q_pos, present = self._targets(target_mapping, T, check_targets)  # (B, P), (B, P, 1)
            rows = q_pos[:, :, None]
            query = (q_pos, None if seg_diff is None else seg_diff.gather(1, rows.expand(-1, -1, T)),
                     None if blocked is None else blocked.expand(B, 1, T, T).gather(2, rows[:, None].expand(-1, 1, -1, T)),
                     present)
            g = self.drop(self.mask_emb.expand(B, q_pos.shape[1], -1))  # (B, P, D)
        k_r = self.drop(relative_positional_encoding(T, cfg, B, dev))  # (B|1, 2T, D)
        hidden, attns = [h], []
        for l, block in enumerate(self.blocks):
            h, g, probs = block(h, g, block.attn.heads(block.attn.r, k_r), content, query,
                                head_mask=None if head_mask is None else head_mask[l], eager=eager)
            hidden.append(h)
            attns.append(probs)
        last = self.drop(h)
        g = None if g is None else self.drop(g)
        if unpad and attention_mask is not None:
            keep = attention_mask.to(h.dtype)[..., None]  # (B, T, 1)
            last, hidden = last * keep, [x * keep for x in hidden]
        return XLNetOutput(
            logits=self.lm_logits(last if g is None else g) if return_logits else None,
            last_hidden_state=last, query_hidden_state=g,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
        )

    def _blocked(self, attention_mask, perm_mask, B: int, T: int, dev: torch.device) -> torch.Tensor | None:
        """(B|1, 1, T, T) bool, True = i may not see j: padding keys, perm_mask, causal ("uni"); or None."""
        blocked = None
        if self.config.attn_type == "uni":
            blocked = torch.ones(T, T, dtype=torch.bool, device=dev).triu(1)[None, None]
        if attention_mask is not None:
            pad = ~attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
            blocked = pad if blocked is None else blocked | pad
        if perm_mask is not None:
            if tuple(perm_mask.shape) != (B, T, T):
                raise ValueError(f"perm_mask must be (B, T, T)={(B, T, T)}, got {tuple(perm_mask.shape)}")
            perm = perm_mask.bool()[:, None]  # (B, 1, T, T)
            blocked = perm if blocked is None else blocked | perm
        return None if blocked is None else blocked.expand(-1, 1, T, T)

    @staticmethod
    def _targets(target_mapping: torch.Tensor, T: int, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, P, T) one-hot (or zero) rows -> target positions (B, P) and row present (B, P, 1);
        `check` refuses other values (a read of the values on the host)."""
        if target_mapping.dim() != 3 or target_mapping.shape[2] != T:
            raise ValueError(f"target_mapping must be (B, P, T={T}), got {tuple(target_mapping.shape)}")
        tm = target_mapping.float()
        if check and (((tm != 0) & (tm != 1)).any() or (tm.sum(2) > 1).any() or (tm.sum(1) > 1).any()):
            raise ValueError("target_mapping rows must be one-hot (or all zero), each position at most once")
        return tm.argmax(2), tm.sum(2, keepdim=True)

    def lm_projection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight (V, D), bias (V,)) of the tied output layer: logits = h weight^T + bias."""
        return self.word_embedding.weight, self.lm_bias

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V): e(x)^T h + b with the word embeddings e (Eq. 3)."""
        return F.linear(hidden, self.word_embedding.weight, self.lm_bias)


class XLNetQueryStream(nn.Module):
    """XLNet's query stream (the stream that predicts) read like a causal LM's layers, for the flow
    suite's curves and lens (docs/flow.md).

    forward(input_ids, attention_mask) runs the model in one factorisation order, left to right
    (perm_mask: position i may not see j >= i), on the ids with one padding position appended, every
    position after the first a target, and returns the query stream's L + 1 states (B, T, D) at
    position t = those of target t + 1: the state that has read tokens <= t (through the content
    stream) and predicts token t + 1, which it has not read (a causal LM's layout). Layer 0 is
    `mask_emb`, the same vector everywhere (the query stream starts from nothing); layer L is the
    model's `query_hidden_state`. `final_norm` (None: post-LN blocks) and `lm_logits` (the tied output
    layer) read any layer through the LM head; `kind` is "decoder" (a causal LM's record reads it).
    Training samples the order and predicts the last sixth of it; one left-to-right order is this
    reading's choice. Hidden states only."""

    kind = "decoder"
    final_norm = None

    def __init__(self, model: XLNet) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    @property
    def n_heads_per_layer(self) -> list[int]:
        return self.model.n_heads_per_layer

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V): the tied output layer e(x)^T g + b."""
        return self.model.lm_logits(h)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False, attn_impl: str = "auto",
                unpad: bool = False, return_logits: bool = False) -> EncoderOutput:
        if output_attentions or return_logits:
            raise ValueError("XLNetQueryStream gives hidden states only (no attentions, no logits)")
        (B, T), dev = input_ids.shape, input_ids.device
        real = input_ids.new_ones(B, T) if attention_mask is None else attention_mask.long()
        ids = torch.cat([input_ids, input_ids.new_zeros(B, 1)], 1)  # (B, T + 1): a target after the last token
        mask = torch.cat([real, real.new_zeros(B, 1)], 1)  # (B, T + 1); the appended position is padding
        perm = torch.ones(T + 1, T + 1, device=dev).triu().expand(B, -1, -1)  # (B, T+1, T+1): i may not see j >= i
        targets = torch.eye(T + 1, device=dev)[1:].expand(B, -1, -1)  # (B, P = T, T + 1): targets 1..T
        states: list[torch.Tensor] = []
        keep = lambda g, name: states.append(g)  # noqa: E731  # each block's query stream, in order
        sites = [(f"blocks.{l}.query_resid_post", keep) for l in range(len(self.model.blocks))]
        with self.model.hooks(fwd=sites):
            out = self.model(ids, attention_mask=mask, perm_mask=perm, target_mapping=targets, attn_impl=attn_impl,
                             return_logits=False)
        g0 = self.model.mask_emb.expand(B, T, -1)  # (B, T, D): the query stream's input (no dropout in eval)
        return EncoderOutput(last_hidden_state=out.query_hidden_state,
                             hidden_states=(g0, *states) if output_hidden_states else None, attentions=None)
