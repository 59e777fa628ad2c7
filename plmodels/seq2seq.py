"""An encoder-decoder transformer of the T5 and BART families, trained by denoising.

T5: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer" (JMLR), as google-research/text-to-text-transfer-transformer (mesh_tensorflow) and
Hugging Face's modeling_t5.py compute it. BART: Lewis et al. 2020, "BART: Denoising
Sequence-to-Sequence Pre-training" (ACL), as fairseq's models/bart and HF's modeling_bart.py do.
Their noising functions are in training/denoising.py; weights import in hf/seq2seq.py.

Reading order: config -> norms and position bias -> MLP -> blocks -> stack -> model. Two stacks:
the encoder (bidirectional self-attention) and the decoder (causal self-attention, then
cross-attention over the encoder output, then the MLP), sharing the token embeddings. Every
attention sub-layer is `components.attention.CrossAttention` (self-attention is memory = x), with
the eager/SDPA paths, head masks and hook sites of the other families.

Family options (`Seq2SeqConfig.t5()` / `.bart()` set them all):
- T5: pre-LN with RMSNorm without bias or mean subtraction, x * rsqrt(mean(x^2) + eps) * g ("T5
  LayerNorm"), and a final norm per stack; no biases anywhere; q k^T is *not* divided by sqrt(Dh)
  (T5 folds it into the init of W_q); relative position buckets (T5's `_relative_position_bucket`:
  half the buckets exact offsets, the rest log-spaced up to max_distance; bidirectional in the
  encoder, keys after the query mapped to bucket 0 in the decoder): one learned scalar per
  (bucket, head), held by the first layer of each stack and added to the scores of every layer of
  that stack (the cross-attention has none); ReLU (T5 1.0) or gated-GELU (T5 1.1) MLP; tied
  embeddings, with the decoder output multiplied by d_model^-0.5 before the tied projection.
- BART: post-LN LayerNorm with biases and no final norm; biases everywhere; learned absolute
  positions with BART's offset of 2 (position t reads row t + 2 of a (max_positions + 2)-row table);
  LayerNorm of the embeddings; GELU (erf); embeddings multiplied by sqrt(d_model) when
  `scale_embedding`; a `final_logits_bias` (V,) added to the logits (all zeros in BART's checkpoints,
  kept as a buffer as fairseq and HF do).

Hook sites (public names): `encoder.embed`, `encoder.blocks.{l}.{resid_pre, attn.*, attn_out,
mlp.post, mlp_out, resid_post}`, `decoder.embed`, `decoder.blocks.{l}.{resid_pre, self_attn.*,
self_attn_out, cross_attn.*, cross_attn_out, mlp.post, mlp_out, resid_post}`, with attn.* one of
q, k, v, scores, pattern, head_out (components/hooks.py). Hidden states follow the house's
convention (hf/gpt2.py): L + 1 per stack, the embedding output then each block's raw output; the
final norm (T5) is applied to last_hidden_state only.

The workbench's analyses read the encoder: called without decoder_input_ids, the model runs its
encoder only and returns an `EncoderOutput` (L + 1 encoder hidden states, the encoder
self-attentions, the encoder's normed output), and `n_heads_per_layer`, `config.n_layers`,
`d_model`, `n_heads`, `max_positions` are the encoder stack's. Training: objectives "t5" and "bart"
(plmodels/training/objectives.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from plmodels.config import Config

from .components.attention import CrossAttention, keep_mask, resolve_attn_impl
from .components.dropout import Dropout
from .components.hooks import HookedModel, HookPoint
from .components.inputs import check_length
from .components.layers import ACTIVATIONS, init_weights
from .components.model_config import config_from_dict
from .components.outputs import EncoderOutput


@dataclass(frozen=True)
class Seq2SeqConfig(Config):
    vocab_size: int = 32128  # number of token ids (T5: 32000 SentencePiece + 100 sentinels, padded)
    d_model: int = 512  # width D
    n_layers: int = 6  # encoder blocks
    n_decoder_layers: int = 6  # decoder blocks
    n_heads: int = 8  # heads H per attention sub-layer; divides d_model
    d_ff: int = 2048  # MLP hidden width
    max_positions: int = 512  # longest sequence per stack (BART: the learned table has max_positions + offset rows)
    position: Literal["relative", "learned"] = "relative"  # T5's relative buckets or BART's learned table
    relative_buckets: int = 32  # T5's relative_attention_num_buckets
    relative_max_distance: int = 128  # T5's relative_attention_max_distance
    position_offset: int = 2  # BART: row t + offset holds position t (fairseq's padding_idx + 1)
    norm: Literal["pre", "post"] = "pre"  # T5: pre-LN with a final norm per stack; BART: post-LN
    norm_kind: Literal["rms", "layer"] = "rms"  # T5's RMSNorm or LayerNorm
    embedding_norm: bool = False  # BART's layernorm_embedding
    scale_embedding: bool = False  # BART option: token embeddings * sqrt(d_model)
    scale_qk: bool = False  # divide q k^T by sqrt(Dh) (BART); T5 does not
    activation: Literal["gelu", "gelu_tanh", "relu"] = "relu"  # MLP activation
    mlp: Literal["plain", "gated"] = "plain"  # gated = act(x W_g) * (x W_u), T5 1.1's gated-GELU
    bias: bool = False  # biases in linear layers and norms
    dropout: float = 0.1  # hidden and attention dropout
    layer_norm_eps: float = 1e-6  # T5: 1e-6, BART: 1e-5
    tie_embeddings: bool = True  # output projection = token embeddings
    rescale_tied_output: bool = True  # T5: decoder output * d_model^-0.5 before the output projection
    final_logits_bias: bool = False  # BART's (V,) logits bias
    pad_token_id: int = 0  # padding id (T5: 0, BART: 1)
    decoder_start_token_id: int = 0  # first decoder input (T5: pad 0, BART: </s> 2)

    def __post_init__(self) -> None:
        name = type(self).__name__
        for key in ("vocab_size", "d_model", "n_layers", "n_decoder_layers", "n_heads", "d_ff", "max_positions",
                    "relative_buckets", "relative_max_distance"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}.{key} must be an int >= 1, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"{name}.n_heads={self.n_heads} must divide d_model={self.d_model}")
        for key, allowed in (("position", ("relative", "learned")), ("norm", ("pre", "post")),
                             ("norm_kind", ("rms", "layer")), ("activation", tuple(ACTIVATIONS)),
                             ("mlp", ("plain", "gated"))):
            if getattr(self, key) not in allowed:
                raise ValueError(f"{name}.{key} must be one of {allowed}, got {getattr(self, key)!r}")
        if self.norm_kind == "rms" and self.bias:
            raise ValueError(f"{name}: norm_kind='rms' has no bias; set bias=false (T5 has none)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{name}.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"{name}.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if self.position_offset < 0:
            raise ValueError(f"{name}.position_offset must be >= 0, got {self.position_offset!r}")
        for key in ("pad_token_id", "decoder_start_token_id"):
            if not 0 <= getattr(self, key) < self.vocab_size:
                raise ValueError(f"{name}.{key}={getattr(self, key)} not in [0, vocab_size)")

    @classmethod
    def t5(cls, **overrides) -> "Seq2SeqConfig":
        """T5's options (the v1.0 ReLU MLP; gated-GELU: mlp="gated", activation="gelu_tanh")."""
        base = dict(position="relative", norm="pre", norm_kind="rms", embedding_norm=False, scale_embedding=False,
                    scale_qk=False, activation="relu", mlp="plain", bias=False, layer_norm_eps=1e-6,
                    tie_embeddings=True, rescale_tied_output=True, final_logits_bias=False, pad_token_id=0,
                    decoder_start_token_id=0)
        return cls(**{**base, **overrides})

    @classmethod
    def bart(cls, **overrides) -> "Seq2SeqConfig":
        """BART's options (bart-base / bart-large: scale_embedding False, as their configs)."""
        base = dict(position="learned", position_offset=2, norm="post", norm_kind="layer", embedding_norm=True,
                    scale_embedding=False, scale_qk=True, activation="gelu", mlp="plain", bias=True,
                    layer_norm_eps=1e-5, tie_embeddings=True, rescale_tied_output=False, final_logits_bias=True,
                    pad_token_id=1, decoder_start_token_id=2, max_positions=1024, vocab_size=50265)
        return cls(**{**base, **overrides})

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> "Seq2SeqConfig":
        return config_from_dict(cls, d, source)


@dataclass
class Seq2SeqOutput:
    """What `Seq2Seq.forward` returns.

    logits: (B, Td, V), or None when `return_logits=False`. encoder_last_hidden_state: (B, Te, D) after the encoder's final norm (T5).
    decoder_last_hidden_state: (B, Td, D) after the decoder's final norm. encoder_hidden_states /
    decoder_hidden_states: L + 1 tensors (embedding output, then each block's raw output) or None.
    encoder_attentions / decoder_attentions: L tensors (B, H, T, T); cross_attentions: L tensors
    (B, H, Td, Te); post-softmax probabilities, head mask applied; or None.
    """

    logits: torch.Tensor | None
    encoder_last_hidden_state: torch.Tensor
    decoder_last_hidden_state: torch.Tensor
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[torch.Tensor, ...] | None = None
    decoder_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


def make_norm(cfg: Seq2SeqConfig) -> nn.Module:
    """T5's RMSNorm x * rsqrt(mean(x^2) + eps) * g (computed in float32 by torch, as T5LayerNorm), or LayerNorm."""
    if cfg.norm_kind == "rms":
        return nn.RMSNorm(cfg.d_model, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)


def relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's `_relative_position_bucket`: relative_position = key - query (any shape) -> bucket ids.

    Bidirectional: half the buckets for keys after the query. Of the rest, half are exact offsets
    0..n/2-1, the others log-spaced up to max_distance (beyond it: the last bucket). Unidirectional
    (decoder): keys after the query all fall in bucket 0 (the causal mask hides them anyway)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    large = max_exact + (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """One learned scalar per (bucket, head), added to every layer's self-attention scores of a stack."""

    def __init__(self, cfg: Seq2SeqConfig, *, bidirectional: bool) -> None:
        super().__init__()
        self.bidirectional, self.buckets, self.max_distance = bidirectional, cfg.relative_buckets, cfg.relative_max_distance
        self.table = nn.Embedding(cfg.relative_buckets, cfg.n_heads)

    def forward(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """-> (1, H, Tq, Tk) additive bias."""
        rel = torch.arange(k_len, device=device)[None, :] - torch.arange(q_len, device=device)[:, None]  # (Tq, Tk)
        b = relative_position_bucket(rel, bidirectional=self.bidirectional, num_buckets=self.buckets,
                                     max_distance=self.max_distance)
        return self.table(b).permute(2, 0, 1)[None]  # (Tq, Tk, H) -> (1, H, Tq, Tk)


class MLP(nn.Module):
    """Position-wise MLP: W_out act(W_in x) (T5 1.0: ReLU; BART: GELU), or gated W_out (act(W_g x) * W_u x)."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.gated = cfg.mlp == "gated"
        self.act = ACTIVATIONS[cfg.activation]
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_ff * (2 if self.gated else 1), bias=cfg.bias)  # W_in, or [W_g; W_u]
        self.fc_out = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.post = HookPoint()  # the hidden activation (B, T, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)  # (B, T, d_ff) or (B, T, 2 d_ff)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # each (B, T, d_ff)
            return self.fc_out(self.post(self.act(gate) * up))
        return self.fc_out(self.post(self.act(h)))


def _attention(cfg: Seq2SeqConfig) -> CrossAttention:
    return CrossAttention(cfg.d_model, cfg.n_heads, bias=cfg.bias, dropout=cfg.dropout, scale=cfg.scale_qk)


class _Residual(nn.Module):
    """What both blocks share: x + Dropout(f(Norm(x))) (pre-LN, T5) or Norm(x + Dropout(f(x))) (post-LN, BART)."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.drop = Dropout(cfg.dropout)

    def sublayer(self, x: torch.Tensor, norm: nn.Module, site: HookPoint,
                 f: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, probs = f(norm(x) if self.pre else x)
        x = x + site(self.drop(out))
        return (x if self.pre else norm(x)), probs


class EncoderBlock(_Residual):
    """Self-attention (bidirectional, + the stack's relative bias) then MLP."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__(cfg)
        self.resid_pre = HookPoint()
        self.attn = _attention(cfg)
        self.norm1 = make_norm(cfg)
        self.attn_out = HookPoint()
        self.mlp = MLP(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp_out, self.resid_post = HookPoint(), HookPoint()

    def forward(self, x, keep, *, bias=None, head_mask=None, eager=False):
        x = self.resid_pre(x)
        x, probs = self.sublayer(x, self.norm1, self.attn_out,
                                 lambda h: self.attn(h, h, keep, bias=bias, head_mask=head_mask, eager=eager))
        x, _ = self.sublayer(x, self.norm2, self.mlp_out, lambda h: (self.mlp(h), None))
        return self.resid_post(x), probs


class DecoderBlock(_Residual):
    """Causal self-attention (+ the stack's relative bias), cross-attention over the encoder output
    (no position bias), then MLP."""

    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__(cfg)
        self.resid_pre = HookPoint()
        self.self_attn = _attention(cfg)
        self.norm1 = make_norm(cfg)
        self.self_attn_out = HookPoint()
        self.cross_attn = _attention(cfg)
        self.norm_cross = make_norm(cfg)
        self.cross_attn_out = HookPoint()
        self.mlp = MLP(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp_out, self.resid_post = HookPoint(), HookPoint()

    def forward(self, x, memory, keep, memory_keep, *, bias=None, is_causal=False, head_mask=None,
                cross_head_mask=None, eager=False):
        x = self.resid_pre(x)
        x, probs = self.sublayer(x, self.norm1, self.self_attn_out, lambda h: self.self_attn(
            h, h, keep, bias=bias, is_causal=is_causal, head_mask=head_mask, eager=eager))
        x, cross = self.sublayer(x, self.norm_cross, self.cross_attn_out, lambda h: self.cross_attn(
            h, memory, memory_keep, head_mask=cross_head_mask, eager=eager))
        x, _ = self.sublayer(x, self.norm2, self.mlp_out, lambda h: (self.mlp(h), None))
        return self.resid_post(x), probs, cross


class Stack(nn.Module):
    """One side's embeddings (token, then learned positions or the relative-bias table), blocks and
    final norm (pre-LN only). The token table is the model's shared one, passed at call time."""

    def __init__(self, cfg: Seq2SeqConfig, *, decoder: bool) -> None:
        super().__init__()
        self.cfg, self.is_decoder = cfg, decoder
        self.positions = (nn.Embedding(cfg.max_positions + cfg.position_offset, cfg.d_model)
                          if cfg.position == "learned" else None)
        self.relative_bias = (RelativePositionBias(cfg, bidirectional=not decoder)
                              if cfg.position == "relative" else None)
        self.embed_norm = make_norm(cfg) if cfg.embedding_norm else None
        self.drop = Dropout(cfg.dropout)
        self.embed = HookPoint()
        n = cfg.n_decoder_layers if decoder else cfg.n_layers
        self.blocks = nn.ModuleList((DecoderBlock if decoder else EncoderBlock)(cfg) for _ in range(n))
        self.final_norm = make_norm(cfg) if cfg.norm == "pre" else None

    def embed_tokens(self, tokens: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        x = tokens(ids)  # (B, T, D)
        if self.cfg.scale_embedding:
            x = x * math.sqrt(self.cfg.d_model)
        if self.positions is not None:  # BART: position t reads row t + offset
            T, off = ids.shape[1], self.cfg.position_offset
            x = x + self.positions.weight[off:off + T]  # (T, D) broadcast over B
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return self.embed(self.drop(x))

    def position_bias(self, T: int, device: torch.device) -> torch.Tensor | None:
        return None if self.relative_bias is None else self.relative_bias(T, T, device)  # (1, H, T, T)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The stack's output: final norm (pre-LN) and dropout, as T5 applies after its final_layer_norm."""
        return self.drop(x if self.final_norm is None else self.final_norm(x))


class Seq2Seq(HookedModel, nn.Module):
    """T5 / BART encoder-decoder. forward(input_ids (B, Te), ..., decoder_input_ids (B, Td)) -> Seq2SeqOutput."""

    kind = "seq2seq"

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        cfg = self.config = config
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)  # token table of both stacks
        self.encoder = Stack(cfg, decoder=False)
        self.decoder = Stack(cfg, decoder=True)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(cfg.vocab_size))
        else:
            self.final_logits_bias = None
        self.apply(init_weights)  # N(0, 0.02) (BART); T5's own init below
        if not cfg.scale_qk:
            self._init_t5()
        self.name_hook_points()

    @torch.no_grad()
    def _init_t5(self) -> None:
        """T5's init (HF T5PreTrainedModel._init_weights, factor 1): N(0, 1) embeddings, W_q N(0, (D Dh)^-1/2)
        -- where the unscaled q k^T gets its 1/sqrt(Dh) --, W_k, W_v, W_in N(0, D^-1/2), W_o N(0, (H Dh)^-1/2),
        W_out N(0, d_ff^-1/2), relative bias N(0, D^-1/2)."""
        D, Dh, F_ = self.config.d_model, self.config.d_model // self.config.n_heads, self.config.d_ff
        nn.init.normal_(self.shared.weight, 0.0, 1.0)
        for m in self.modules():
            if isinstance(m, CrossAttention):
                nn.init.normal_(m.q_proj.weight, 0.0, (D * Dh) ** -0.5)
                nn.init.normal_(m.kv_proj.weight, 0.0, D ** -0.5)
                nn.init.normal_(m.out.weight, 0.0, D ** -0.5)  # H Dh = D
            elif isinstance(m, MLP):
                nn.init.normal_(m.fc_in.weight, 0.0, D ** -0.5)
                nn.init.normal_(m.fc_out.weight, 0.0, F_ ** -0.5)
            elif isinstance(m, RelativePositionBias):
                nn.init.normal_(m.table.weight, 0.0, D ** -0.5)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, 0.0, 1.0)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher-forcing decoder inputs from targets (B, T): [start, labels[:, :-1]], -100 -> pad."""
        start = labels.new_full((labels.shape[0], 1), self.config.decoder_start_token_id)
        shifted = torch.cat([start, labels[:, :-1]], dim=1)
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    def _check_head_mask(self, head_mask: torch.Tensor | None, n_layers: int, what: str) -> None:
        if head_mask is not None and tuple(head_mask.shape) != (n_layers, self.config.n_heads):
            raise ValueError(f"{what} must be (n_layers={n_layers}, n_heads={self.config.n_heads}), "
                             f"got {tuple(head_mask.shape)}")

    @property
    def n_heads_per_layer(self) -> list[int]:
        """Heads per *encoder* layer: what the workbench's analyses read (the encoder's layers)."""
        return [block.attn.n_heads for block in self.encoder.blocks]

    ATTENTION_KINDS = ("encoder", "decoder", "cross")  # the rows of the all-heads grid, in this order

    @property
    def all_heads_per_layer(self) -> list[int]:
        """Heads per attention sub-layer of the whole model, the rows of head importance's grid: the
        encoder's self-attention layers, then the decoder's self-attention, then its cross-attention."""
        dec = self.decoder.blocks
        return (self.n_heads_per_layer + [b.self_attn.n_heads for b in dec] + [b.cross_attn.n_heads for b in dec])

    def attention_rows(self) -> list[tuple[str, int]]:
        """(kind, layer within its stack) of each row of the all-heads grid (`all_heads_per_layer`)."""
        Le, Ld = self.config.n_layers, self.config.n_decoder_layers
        return [("encoder", l) for l in range(Le)] + [(k, l) for k in ("decoder", "cross") for l in range(Ld)]

    def head_out_sites(self) -> list[tuple[str, str]]:
        """(hook site of the heads' outputs, the batch key of its real-position mask) per all-heads row."""
        names = {"encoder": ("encoder.blocks.{}.attn.head_out", "attention_mask"),
                 "decoder": ("decoder.blocks.{}.self_attn.head_out", "decoder_attention_mask"),
                 "cross": ("decoder.blocks.{}.cross_attn.head_out", "decoder_attention_mask")}
        return [(names[k][0].format(l), names[k][1]) for k, l in self.attention_rows()]

    def split_head_mask(self, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """An all-heads mask (Le + 2 Ld, H) -> forward's head_mask, decoder_head_mask and cross_attn_head_mask."""
        Le, Ld = self.config.n_layers, self.config.n_decoder_layers
        if mask.shape[0] != Le + 2 * Ld:
            raise ValueError(f"an all-heads mask has n_layers + 2 n_decoder_layers = {Le + 2 * Ld} rows, "
                             f"got {tuple(mask.shape)}")
        return {"head_mask": mask[:Le], "decoder_head_mask": mask[Le:Le + Ld], "cross_attn_head_mask": mask[Le + Ld:]}

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        decoder_head_mask: torch.Tensor | None = None,
        cross_attn_head_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        attn_impl: str = "auto",
        return_logits: bool = True,
        unpad: bool = False,
    ) -> Seq2SeqOutput | EncoderOutput:
        """input_ids / attention_mask (B, Te): the encoder's; decoder_input_ids / decoder_attention_mask
        (B, Td): the decoder's (teacher forcing, e.g. `shift_right(targets)`). Head masks (L, H), one per
        kind of attention sub-layer: encoder self-, decoder self- and cross-attention.

        Without decoder_input_ids only the encoder runs and the result is an `EncoderOutput` (the
        workbench's uniform call: its hidden_states are the encoder's L + 1, attentions the encoder
        self-attentions, last_hidden_state the encoder's output after its final norm); `unpad`
        (accepted for that call) zeroes the outputs at the padding, as the encoder's unpadded path
        gives, the padded tokens being computed and dropped. return_logits=False skips the (B, Td, V)
        projection (the training loss projects the decoder output itself)."""
        cfg = self.config
        decoder_masks = (decoder_attention_mask, decoder_head_mask, cross_attn_head_mask)
        if decoder_input_ids is None and any(m is not None for m in decoder_masks):
            raise ValueError("decoder masks were given without decoder_input_ids (teacher forcing: "
                             "model.shift_right(targets)); without them only the encoder runs")
        Te = input_ids.shape[1]
        Td = 0 if decoder_input_ids is None else decoder_input_ids.shape[1]
        check_length(max(Te, Td), cfg.max_positions)
        self._check_head_mask(head_mask, cfg.n_layers, "head_mask")
        self._check_head_mask(decoder_head_mask, cfg.n_decoder_layers, "decoder_head_mask")
        self._check_head_mask(cross_attn_head_mask, cfg.n_decoder_layers, "cross_attn_head_mask")
        any_mask = next((m for m in (head_mask, decoder_head_mask, cross_attn_head_mask) if m is not None), None)
        eager = resolve_attn_impl(attn_impl, output_attentions=output_attentions, head_mask=any_mask,
                                  pattern_hooks=self._pattern_hooks_active())
        dev = input_ids.device

        # encoder: bidirectional self-attention over the real tokens
        enc_keep, _ = keep_mask(attention_mask, Te, dev, causal=False, explicit=eager)  # (B, 1, 1, Te) or None
        bias = self.encoder.position_bias(Te, dev)
        x = self.encoder.embed_tokens(self.shared, input_ids)
        enc_hidden, enc_attns = [x], []
        for l, block in enumerate(self.encoder.blocks):
            x, probs = block(x, enc_keep, bias=bias, head_mask=None if head_mask is None else head_mask[l], eager=eager)
            enc_hidden.append(x)
            enc_attns.append(probs)
        memory = self.encoder.finish(x)
        if decoder_input_ids is None:
            return self._encoder_output(memory, enc_hidden, enc_attns, attention_mask if unpad else None,
                                        output_hidden_states, output_attentions)

        # decoder: causal self-attention, then cross-attention over the encoder's real tokens
        explicit = eager or bias is not None or decoder_attention_mask is not None
        dec_keep, is_causal = keep_mask(decoder_attention_mask, Td, dev, causal=True, explicit=explicit)
        bias = self.decoder.position_bias(Td, dev)
        y = self.decoder.embed_tokens(self.shared, decoder_input_ids)
        dec_hidden, dec_attns, cross_attns = [y], [], []
        for l, block in enumerate(self.decoder.blocks):
            y, probs, cross = block(
                y, memory, dec_keep, enc_keep, bias=bias, is_causal=is_causal, eager=eager,
                head_mask=None if decoder_head_mask is None else decoder_head_mask[l],
                cross_head_mask=None if cross_attn_head_mask is None else cross_attn_head_mask[l])
            dec_hidden.append(y)
            dec_attns.append(probs)
            cross_attns.append(cross)
        last = self.decoder.finish(y)
        return Seq2SeqOutput(
            logits=self.lm_logits(last) if return_logits else None,
            encoder_last_hidden_state=memory,
            decoder_last_hidden_state=last,
            encoder_hidden_states=tuple(enc_hidden) if output_hidden_states else None,
            decoder_hidden_states=tuple(dec_hidden) if output_hidden_states else None,
            encoder_attentions=tuple(enc_attns) if output_attentions else None,
            decoder_attentions=tuple(dec_attns) if output_attentions else None,
            cross_attentions=tuple(cross_attns) if output_attentions else None,
        )

    @staticmethod
    def _encoder_output(memory, hidden, attns, zero_pad_mask, output_hidden_states, output_attentions) -> EncoderOutput:
        """The encoder-only result; with `zero_pad_mask` (B, Te) the outputs are zero at its padding."""
        if zero_pad_mask is not None:
            keep = zero_pad_mask.to(memory.dtype)[..., None]  # (B, Te, 1)
            memory, hidden = memory * keep, [h * keep for h in hidden]
        return EncoderOutput(last_hidden_state=memory,
                             hidden_states=tuple(hidden) if output_hidden_states else None,
                             attentions=tuple(attns) if output_attentions else None)

    def lm_projection(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight (V, D), bias (V,) or None) of the output layer, for the fused training loss:
        logits = lm_transform(h) weight^T + bias = lm_logits(h)."""
        weight = self.shared.weight if self.lm_head is None else self.lm_head.weight
        return weight, self.final_logits_bias

    def lm_transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """T5's d_model^-0.5 rescaling of the tied output (identity otherwise)."""
        return hidden * self.config.d_model ** -0.5 if self.config.rescale_tied_output else hidden

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder output -> (..., V): T5 rescales by d_model^-0.5 (`rescale_tied_output`, set
        when its head is tied); BART adds final_logits_bias."""
        hidden = self.lm_transform(hidden)
        logits = F.linear(hidden, self.shared.weight) if self.lm_head is None else self.lm_head(hidden)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias


class TeacherForcedDecoder(nn.Module):
    """A Seq2Seq's decoder stack read like an encoder, for probing its layers under teacher forcing.

    forward(input_ids, attention_mask) runs the encoder on the sentence and the decoder on
    [decoder start] + the sentence (the target is the uncorrupted sentence, as BART's is), and returns
    the decoder's L_dec + 1 hidden states at the positions that have just read each token: position
    t + 1 for token t, the state that predicts token t + 1, so token t's vector has seen target tokens
    0..t and the whole source. For T5, whose decoder is trained on sentinel-delimited spans only, a
    whole sentence as target is off its training distribution (say so beside any T5 decoder result).
    `kind` is "decoder" (causal: span probes pool a span's last token); `config` is the model's with
    n_layers = n_decoder_layers and one position fewer (the start token takes one); `final_norm` and
    `lm_logits` read a layer through the LM head (the flow suite's lens). Hidden states
    only: the decoder's self- and cross-attention heads are analysed by cross_heads and prune."""

    kind = "decoder"

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model
        cfg = model.config
        self.config = dataclasses.replace(cfg, n_layers=cfg.n_decoder_layers, max_positions=cfg.max_positions - 1)

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [block.self_attn.n_heads for block in self.model.decoder.blocks]

    @property
    def final_norm(self) -> nn.Module | None:
        """The decoder stack's final norm (pre-LN T5; None for post-LN BART), as a decoder's: with
        `lm_logits`, the decoder family's lens readout reads this stack (probes/lens.py)."""
        return self.model.decoder.final_norm

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) decoder output (after `final_norm`) -> (..., V): the model's own LM head."""
        return self.model.lm_logits(hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False, output_attentions: bool = False, attn_impl: str = "auto",
                unpad: bool = False, return_logits: bool = False) -> EncoderOutput:
        if output_attentions or return_logits:
            raise ValueError("TeacherForcedDecoder gives hidden states only (no attentions, no logits)")
        B = input_ids.shape[0]
        start = input_ids.new_full((B, 1), self.model.config.decoder_start_token_id)
        dec_mask = None if attention_mask is None else torch.cat([attention_mask.new_ones(B, 1), attention_mask], 1)
        out = self.model(input_ids, attention_mask=attention_mask, decoder_input_ids=torch.cat([start, input_ids], 1),
                         decoder_attention_mask=dec_mask, output_hidden_states=True, attn_impl=attn_impl,
                         return_logits=False)
        hidden = [h[:, 1:] for h in out.decoder_hidden_states]
        last = out.decoder_last_hidden_state[:, 1:]
        if unpad and attention_mask is not None:  # zero at the padding, as the encoder's unpadded path gives
            keep = attention_mask.to(last.dtype)[..., None]
            last, hidden = last * keep, [h * keep for h in hidden]
        return EncoderOutput(last_hidden_state=last, hidden_states=tuple(hidden) if output_hidden_states else None,
                             attentions=None)
