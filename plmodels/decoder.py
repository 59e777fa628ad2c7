"""A GPT-2-style decoder (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners").

Reading order: config -> model. Blocks, MLP and config checks are the encoder's (encoder.py): the
two models differ only in the causal mask, the embeddings and the head. Defaults are GPT-2's: pre-LN
blocks x = x + Dropout(Sublayer(LN(x))) with a final LayerNorm, learned positions, tanh-GELU,
dropout 0.1, eps 1e-5, LM head tied to the token embeddings. Init: N(0, 0.02), and GPT-2's scaled
init N(0, 0.02 / sqrt(2 L)) for the projections that write into the residual stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .attention import keep_mask, resolve_attn_impl
from .encoder import (
    Block,
    PrunableMixin,
    check_length,
    check_shared_fields,
    config_from_dict,
    config_to_dict,
    init_weights,
    layer_norm,
    packing_for,
)
from .dropout import Dropout
from .hooks import HookedModel, HookPoint
from .outputs import DecoderOutput
from .positions import alibi_distance, rope_cos_sin


@dataclass(frozen=True)
class DecoderConfig:
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
    pruned_heads: dict[int, list[int]] = field(default_factory=dict)  # {layer: original head ids}

    def __post_init__(self) -> None:
        check_shared_fields(self)

    def to_dict(self) -> dict:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DecoderConfig":
        return config_from_dict(cls, d)


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
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
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
            kw["rope"] = rope_cos_sin(T, cfg.d_model // cfg.n_heads, input_ids.device)
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
        """(..., D) -> (..., V) next-token logits (tied to the token embeddings by default)."""
        return F.linear(hidden, self.lm_weight())

    def lm_weight(self) -> torch.Tensor:
        """(V, D) weight of the LM head (the token embeddings when tied)."""
        return self.wte.weight if self.lm_head is None else self.lm_head.weight
