"""A GPT-2-style decoder (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners").

GPT-NeoX's variant (Black et al. 2022, "GPT-NeoX-20B"; the Pythia suite, Biderman et al. 2023) is
three options: `parallel_residual` (x + Attn(LN1(x)) + MLP(LN2(x)), both sub-layers reading the block
input), `rotary_dims` (RoPE on the first R channels of each head, Pythia's rotary_pct 0.25) and
`rope_base`; with position "rope" and an untied head they compute GPTNeoXForCausalLM
(plmodels/hf/gpt_neox.py imports it).

Reading order: config -> MLP -> block -> model. The attention sub-layer (fused QKV, eager/SDPA
paths, causal masks) and what every family shares (hook sites, head pruning, config checks, init,
unpadding) live in components/. Defaults are GPT-2's: pre-LN blocks x = x + Dropout(Sublayer(LN(x)))
with a final LayerNorm, learned positions, tanh-GELU, dropout 0.1, eps 1e-5, LM head tied to the
token embeddings. Init: N(0, 0.02), and GPT-2's scaled
init N(0, 0.02 / sqrt(2 L)) for the projections that write into the residual stream.

`output="adaptive"` replaces the (V, D) softmax layer with the adaptive softmax of Grave et al. 2017
("Efficient softmax approximation for GPUs"): the token ids are ranked by training frequency
(`vocab_rank`, set by the trainer from its corpus counts, saved with the weights); the head is a
softmax over the `adaptive_cutoffs[0]` most frequent tokens plus one entry per tail cluster, and
tail cluster i (ranks cutoffs[i] .. cutoffs[i+1]) is a softmax over a D / div^(i+1) projection:
log p(w) = log p_head(cluster(w)) + log p_cluster(w). The distribution is exact (it sums to 1), so
perplexities compare with the full softmax's; a training step only evaluates the tails for the
targets that fall in them, which makes the output layer several times cheaper when, as with a 16k
BPE vocabulary, most tokens are frequent ones. The output weights are not tied to the embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from plmodels.config import Config

from .components.attention import MultiHeadAttention, keep_mask, resolve_attn_impl
from .components.dropout import Dropout
from .components.hooks import HookedModel, HookPoint
from .components.inputs import check_length, packing_for
from .components.layers import ACTIVATIONS, init_weights, layer_norm
from .components.model_config import check_shared_fields, config_from_dict
from .components.outputs import DecoderOutput
from .components.positions import alibi_distance, rope_cos_sin
from .components.pruning import PrunableMixin


@dataclass(frozen=True)
class DecoderConfig(Config):
    vocab_size: int = 50257  # number of token ids
    d_model: int = 768  # width D
    n_layers: int = 12  # blocks L
    n_heads: int = 12  # heads H per block (before pruning); divides d_model
    d_ff: int = 3072  # MLP hidden width
    max_positions: int = 1024  # longest sequence (learned table size; limit for rope/alibi too)
    position: Literal["learned", "rope", "alibi"] = "learned"  # position encoding
    norm: Literal["post", "pre"] = "pre"  # LayerNorm placement (GPT-2: pre)
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu_tanh"  # MLP activation
    mlp: Literal["plain", "gated"] = "plain"  # gated = GLU with the activation
    bias: bool = True  # biases in linear layers and LayerNorms
    dropout: float = 0.1  # hidden and attention dropout
    layer_norm_eps: float = 1e-5  # GPT-2's epsilon
    tie_embeddings: bool = True  # LM head weight = token embeddings
    output: Literal["softmax", "adaptive"] = "softmax"  # full softmax, or Grave et al.'s adaptive softmax
    adaptive_cutoffs: tuple[int, ...] = (2000, 6000)  # frequency ranks where the tail clusters start
    adaptive_div: float = 4.0  # tail cluster i projects to d_model / div^(i+1) dimensions
    pruned_heads: dict[int, list[int]] = field(default_factory=dict)  # {layer: original head ids}
    # GPT-NeoX's options (Black et al. 2022; Pythia, Biderman et al. 2023), left out of to_dict at their defaults:
    parallel_residual: bool = False  # x + Attn(LN1(x)) + MLP(LN2(x)): both sub-layers read the block input (pre-LN)
    rotary_dims: int | None = None  # RoPE on the first rotary_dims channels of each head (even); None = all
    rope_base: float = 10000.0  # RoPE's theta base: channel pair i turns by pos * base^(-2i/rotary_dims)

    # fields added after checkpoints existed: to_dict leaves them out at their default, so a config
    # that does not use them writes the same config.json (and checkpoint_hash) as before
    LATER_FIELDS: ClassVar[dict[str, Any]] = {"parallel_residual": False, "rotary_dims": None, "rope_base": 10000.0}

    def __post_init__(self) -> None:
        check_shared_fields(self)
        if not isinstance(self.parallel_residual, bool):
            raise ValueError(f"DecoderConfig.parallel_residual must be true or false, got {self.parallel_residual!r}")
        if self.parallel_residual and self.norm != "pre":
            raise ValueError("DecoderConfig.parallel_residual=true needs norm='pre' (both sub-layers read LN(x) of "
                             f"the block input), got norm={self.norm!r}")
        head_dim = self.d_model // self.n_heads
        if self.rotary_dims is not None:
            if self.position != "rope":
                raise ValueError(f"DecoderConfig.rotary_dims={self.rotary_dims!r} needs position='rope', "
                                 f"got {self.position!r}")
            if (not isinstance(self.rotary_dims, int) or isinstance(self.rotary_dims, bool)
                    or not 2 <= self.rotary_dims <= head_dim or self.rotary_dims % 2):
                raise ValueError(f"DecoderConfig.rotary_dims must be an even int in [2, head dim {head_dim}] "
                                 f"or null, got {self.rotary_dims!r}")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or not self.rope_base > 1:
            raise ValueError(f"DecoderConfig.rope_base must be a number > 1, got {self.rope_base!r}")
        object.__setattr__(self, "adaptive_cutoffs", tuple(self.adaptive_cutoffs))  # JSON gives a list
        if self.output not in ("softmax", "adaptive"):
            raise ValueError(f"DecoderConfig.output must be 'softmax' or 'adaptive', got {self.output!r}")
        if self.output == "adaptive":
            cut = self.adaptive_cutoffs
            if (not cut or any(not isinstance(c, int) or isinstance(c, bool) for c in cut)
                    or list(cut) != sorted(set(cut)) or cut[0] < 1 or cut[-1] >= self.vocab_size):
                raise ValueError(f"DecoderConfig.adaptive_cutoffs must be increasing ints in [1, vocab_size="
                                 f"{self.vocab_size}), got {list(cut)}")
            if self.tie_embeddings:
                raise ValueError("DecoderConfig.output='adaptive' has its own output weights: set tie_embeddings=false")
            if not self.adaptive_div >= 1.0:
                raise ValueError(f"DecoderConfig.adaptive_div must be >= 1, got {self.adaptive_div!r}")

    @property
    def rope_dims(self) -> int:
        """Channels of each head that RoPE rotates (the head dim unless rotary_dims says fewer)."""
        return self.d_model // self.n_heads if self.rotary_dims is None else self.rotary_dims

    def to_dict(self) -> dict:
        d = super().to_dict()
        for name, default in self.LATER_FIELDS.items():
            if d.get(name) == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> "DecoderConfig":
        return config_from_dict(cls, d, source)



class MLP(nn.Module):
    """Position-wise MLP: W_out act(W_in x) (GPT-2: tanh-GELU), or gated W_out (act(W_g x) * W_u x)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gated = cfg.mlp == "gated"
        self.act = ACTIVATIONS[cfg.activation]
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_ff * (2 if self.gated else 1), bias=cfg.bias)  # W_in, or [W_g; W_u]
        self.fc_out = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.post = HookPoint()  # the hidden activation, (B, T, d_ff): TransformerLens' mlp.hook_post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)  # (B, T, d_ff) or (B, T, 2 d_ff)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # each (B, T, d_ff)
            return self.fc_out(self.post(self.act(gate) * up))
        return self.fc_out(self.post(self.act(h)))


class Block(nn.Module):
    """One decoder block with its hook sites: pre-LN (GPT-2), pre-LN with a parallel residual
    (GPT-NeoX) or post-LN; the causal mask comes in through `keep` / `is_causal` (attention.keep_mask)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.parallel = cfg.parallel_residual
        self.resid_pre = HookPoint()  # created first so hook_names() lists sites in forward order
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=cfg.bias, dropout=cfg.dropout, position=cfg.position)
        self.norm1, self.norm2 = layer_norm(cfg), layer_norm(cfg)  # before (pre-LN) or after (post-LN) each sub-layer
        self.attn_out = HookPoint()  # before the MLP's own site, in forward order (no weights: init unchanged)
        self.mlp = MLP(cfg)
        self.drop = Dropout(cfg.dropout)
        self.mlp_out, self.resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, keep, **attn_kw) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.resid_pre(x)
        if self.parallel:  # GPT-NeoX: x = x + Dropout(Attn(LN1(x))) + Dropout(MLP(LN2(x))), one input
            a, probs = self.attn(self.norm1(x), keep, **attn_kw)
            a = self.attn_out(self.drop(a))
            x = x + a + self.mlp_out(self.drop(self.mlp(self.norm2(x))))
        elif self.pre:  # GPT-2: x = x + Dropout(Sublayer(LN(x)))
            a, probs = self.attn(self.norm1(x), keep, **attn_kw)
            x = x + self.attn_out(self.drop(a))
            x = x + self.mlp_out(self.drop(self.mlp(self.norm2(x))))
        else:  # x = LN(x + Dropout(Sublayer(x)))
            a, probs = self.attn(x, keep, **attn_kw)
            x = self.norm1(x + self.attn_out(self.drop(a)))
            x = self.norm2(x + self.mlp_out(self.drop(self.mlp(x))))
        return self.resid_post(x), probs


class Decoder(HookedModel, PrunableMixin, nn.Module):
    """GPT-2-style causal decoder. forward(input_ids (B, T), ...) -> DecoderOutput."""

    kind = "decoder"

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        cfg = config
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model) if cfg.position == "learned" else None
        self.drop = Dropout(cfg.dropout)
        self.embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = layer_norm(cfg) if cfg.norm == "pre" else None
        self.lm_head = None
        if cfg.output == "adaptive":  # frequency rank of each token id; identity until set_vocab_order
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(cfg.d_model, cfg.vocab_size, list(cfg.adaptive_cutoffs),
                                                          div_value=cfg.adaptive_div, head_bias=cfg.bias)
            self.register_buffer("vocab_rank", torch.arange(cfg.vocab_size))
        elif not cfg.tie_embeddings:
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(init_weights)
        for block in self.blocks:  # GPT-2: residual projections scaled by 1/sqrt(2 L)
            for proj in (block.attn.out, block.mlp.fc_out):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))
        self._apply_config_pruning(cfg)
        self.name_hook_points()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        attn_impl: str = "auto",
        return_logits: bool = True,
        unpad: bool = False,
    ) -> DecoderOutput:
        """unpad=True: the position-wise layers see the real tokens only (see Encoder.forward)."""
        cfg = self.config
        T = input_ids.shape[1]
        check_length(T, cfg.max_positions)
        self._check_head_mask(head_mask)
        packing = packing_for(self, attention_mask, unpad)
        eager = resolve_attn_impl(
            attn_impl, output_attentions=output_attentions, head_mask=head_mask, pattern_hooks=self._pattern_hooks_active()
        )
        # (B|1, 1, T, T) causal & padding, or None with is_causal for the fused kernel
        keep, is_causal = keep_mask(
            attention_mask, T, input_ids.device, causal=True, explicit=eager or cfg.position == "alibi"
        )
        kw: dict[str, Any] = {"eager": eager, "is_causal": is_causal, "packing": packing}
        if cfg.position == "rope":
            kw["rope"] = rope_cos_sin(T, cfg.rope_dims, input_ids.device, base=cfg.rope_base)  # (T, R) each
        elif cfg.position == "alibi":
            kw["alibi_dist"] = alibi_distance(T, input_ids.device)  # = -(i - j) wherever j <= i
        x = self.wte(input_ids)  # (B, T, D)
        if self.wpe is not None:
            x = x + self.wpe.weight[:T]  # (T, D) broadcast over B
        x = self.embed(self.drop(x))
        x = x if packing is None else packing.pack(x)  # (N, D): real tokens only
        hidden, attns = [x], []
        for l, block in enumerate(self.blocks):
            x, probs = block(x, keep, head_mask=None if head_mask is None else head_mask[l], **kw)
            hidden.append(x)
            attns.append(probs)
        last = x if self.final_norm is None else self.final_norm(x)
        if packing is not None:  # back to (B, T, D)
            last = packing.pad(last)
            hidden = [packing.pad(h) for h in hidden] if output_hidden_states else hidden
        return DecoderOutput(
            last_hidden_state=last,
            logits=self.lm_logits(last) if return_logits else None,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
        )

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V) next-token logits (tied to the token embeddings by default).

        With the adaptive output these are log-probabilities (they already sum to 1 under exp), in
        token-id order; softmax and cross-entropy read them as they read logits."""
        if self.config.output == "adaptive":
            with torch.autocast(hidden.device.type, enabled=False):  # fp32 (see adaptive_loss)
                logp = self.adaptive.log_prob(hidden.reshape(-1, hidden.shape[-1]).float())  # (N, V), rank order
            return logp.index_select(1, self.vocab_rank).reshape(*hidden.shape[:-1], -1)
        return F.linear(hidden, self.lm_weight())

    def lm_weight(self) -> torch.Tensor:
        """(V, D) weight of the LM head (the token embeddings when tied)."""
        if self.config.output == "adaptive":
            raise ValueError("the adaptive output has no (V, D) weight matrix: use lm_logits or adaptive_loss")
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    def adaptive_loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Summed -log p(target) under the adaptive output; hidden (N, D), targets (N,) token ids, none
        ignored. Only the tail clusters that hold some target are evaluated (Grave et al. 2017).
        Computed in fp32 with autocast off: torch's module mixes dtypes under bf16 autocast and fails."""
        if targets.numel() == 0:
            return hidden.sum() * 0.0
        with torch.autocast(hidden.device.type, enabled=False):
            return self.adaptive(hidden.float(), self.vocab_rank[targets]).loss * targets.numel()

    @torch.no_grad()
    def set_vocab_order(self, counts: torch.Tensor) -> None:
        """Rank the token ids by `counts` (V,), most frequent first (ties by id), for the adaptive output."""
        if counts.shape != (self.config.vocab_size,):
            raise ValueError(f"set_vocab_order: counts has shape {tuple(counts.shape)}, need ({self.config.vocab_size},)")
        order = torch.sort(-counts.double(), stable=True).indices  # rank -> id
        self.vocab_rank.copy_(torch.empty_like(order).scatter_(0, order, torch.arange(len(order))))
