"""A BERT-style encoder (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers").

Reading order: config -> MLP -> block -> embeddings -> heads -> model. The attention sub-layer
(fused QKV, eager/SDPA paths) and what every family shares (hook sites, head pruning, config checks,
init, unpadding) live in components/ (see its docstring for what is shared and why).

Defaults are the BERT recipe: post-LN blocks x = LN(x + Dropout(Sublayer(x))), learned absolute
positions, GELU (erf), biases, dropout 0.1, LayerNorm eps 1e-12, MLM decoder tied to the word
embeddings. Options: pre-LN blocks x = x + Dropout(Sublayer(LN(x))) with a final LayerNorm
(Xiong et al. 2020), RoPE (Su et al. 2021) or symmetric ALiBi (Press et al. 2022) positions,
gated MLP act(x W_g) * (x W_u) (Shazeer 2020, "GLU Variants Improve Transformer"), no biases,
and RoBERTa's padding-dependent position ids (`position_ids="roberta"`, Liu et al. 2019, as fairseq's
`make_positions`), which the RoBERTa importer (hf/encoders.py) needs. ALBERT (Lan et al. 2020, "ALBERT:
A Lite BERT"): factorised embeddings (`embedding_size`) and cross-layer parameter sharing
(`share_layers`, Table 4's all-shared / shared-attention / shared-FFN): blocks 1..L-1 hold block 0's
nn.Parameter objects but keep their own modules, so hook sites, hidden states, attentions and head
masks stay per layer; the state dict holds each shared tensor once (under block 0's name).
Init: N(0, 0.02) for every weight matrix and embedding, zero biases, unit LayerNorm gains.
"""

from __future__ import annotations

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
from .components.outputs import EncoderOutput
from .components.positions import alibi_distance, padding_position_ids, rope_cos_sin
from .components.pruning import PrunableMixin, tie_parameters

# the sub-modules of a block whose parameters each `share_layers` mode ties across depth (ALBERT, Table 4)
SHARED_PARTS: dict[str, tuple[str, ...]] = {
    "none": (), "all": ("attn", "mlp", "norm1", "norm2"), "attention": ("attn",), "ffn": ("mlp",),
}


@dataclass(frozen=True)
class EncoderConfig(Config):
    vocab_size: int = 30522  # number of token ids
    d_model: int = 768  # width D
    n_layers: int = 12  # blocks L
    n_heads: int = 12  # heads H per block (before pruning); divides d_model
    d_ff: int = 3072  # MLP hidden width
    max_positions: int = 512  # longest sequence (learned table size; limit for rope/alibi too)
    position: Literal["learned", "rope", "alibi"] = "learned"  # position encoding
    norm: Literal["post", "pre"] = "post"  # LayerNorm placement (BERT: post)
    activation: Literal["gelu", "gelu_tanh", "relu"] = "gelu"  # MLP activation
    mlp: Literal["plain", "gated"] = "plain"  # gated = GLU with the activation
    bias: bool = True  # biases in linear layers and LayerNorms
    dropout: float = 0.1  # hidden and attention dropout
    layer_norm_eps: float = 1e-12  # BERT's epsilon
    tie_embeddings: bool = True  # MLM decoder weight = word embeddings
    type_vocab_size: int = 2  # segment ids (0 = no segment embedding)
    use_nsp: bool = False  # next-sentence-prediction head on the pooler
    pad_token_id: int = 0  # id of [PAD]
    pruned_heads: dict[int, list[int]] = field(default_factory=dict)  # {layer: original head ids}
    # learned positions only: "index" = row t for token t (BERT); "roberta" = row pad_token_id +
    # (count of non-[PAD] ids up to t) for a real token and row pad_token_id for a [PAD] (RoBERTa /
    # fairseq make_positions: read from input_ids, so padding on either side is skipped); the table
    # then has max_positions + pad_token_id + 1 rows. Left out of to_dict at its default.
    position_ids: Literal["index", "roberta"] = "index"
    # ELECTRA / ALBERT factorised embeddings: tables of width E, then a projection E -> D (None: E = D)
    embedding_size: int | None = None
    use_rtd: bool = False  # ELECTRA's replaced-token-detection head (per token: replaced or original)
    share_layers: Literal["none", "all", "attention", "ffn"] = "none"  # ALBERT: SHARED_PARTS of block 0 serve all

    # fields added after checkpoints existed: to_dict leaves them out at their default, so a config
    # that does not use them writes the same config.json (and checkpoint_hash) as before
    LATER_FIELDS: ClassVar[dict[str, Any]] = {
        "position_ids": "index", "embedding_size": None, "use_rtd": False, "share_layers": "none",
    }

    def __post_init__(self) -> None:
        check_shared_fields(self)
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ValueError(f"EncoderConfig.type_vocab_size must be an int >= 0, got {self.type_vocab_size!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"EncoderConfig.pad_token_id={self.pad_token_id} not in [0, vocab_size)")
        if self.position_ids not in ("index", "roberta"):
            raise ValueError(f"EncoderConfig.position_ids must be 'index' or 'roberta', got {self.position_ids!r}")
        if self.position_ids == "roberta" and self.position != "learned":
            raise ValueError(f"EncoderConfig.position_ids='roberta' needs position='learned', got {self.position!r}")
        if self.embedding_size is not None and (not isinstance(self.embedding_size, int) or self.embedding_size < 1):
            raise ValueError(f"EncoderConfig.embedding_size must be a positive int or null, got {self.embedding_size!r}")
        if self.share_layers not in SHARED_PARTS:
            raise ValueError(
                f"EncoderConfig.share_layers must be one of {tuple(SHARED_PARTS)}, got {self.share_layers!r}"
            )
        pruned = {tuple(sorted(self.pruned_heads.get(l, []))) for l in range(self.n_layers)}
        if "attn" in SHARED_PARTS[self.share_layers] and len(pruned) > 1:
            raise ValueError(
                f"EncoderConfig.pruned_heads={self.pruned_heads!r}: with share_layers={self.share_layers!r} "
                "every layer uses block 0's attention weights, so every layer must have the same heads pruned"
            )

    @property
    def embedding_width(self) -> int:
        """E: the width of the embedding tables (and of the MLM head's transform), D unless factorised."""
        return self.d_model if self.embedding_size is None else self.embedding_size

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table: max_positions, plus pad_token_id + 1 for RoBERTa ids."""
        return self.max_positions + (self.pad_token_id + 1 if self.position_ids == "roberta" else 0)

    def to_dict(self) -> dict:
        d = super().to_dict()
        for name, default in self.LATER_FIELDS.items():
            if d.get(name) == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> "EncoderConfig":
        return config_from_dict(cls, d, source)


class MLP(nn.Module):
    """Position-wise MLP: W_out act(W_in x), or gated W_out (act(W_g x) * W_u x) (Shazeer 2020)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.gated = cfg.mlp == "gated"
        self.act = ACTIVATIONS[cfg.activation]
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_ff * (2 if self.gated else 1), bias=cfg.bias)
        self.fc_out = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.post = HookPoint()  # the hidden activation, (B, T, d_ff): TransformerLens' mlp.hook_post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc_in(x)  # (B, T, d_ff) or (B, T, 2 d_ff)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # each (B, T, d_ff)
            return self.fc_out(self.post(self.act(gate) * up))
        return self.fc_out(self.post(self.act(h)))


class Block(nn.Module):
    """One encoder block, post-LN (BERT) or pre-LN (Xiong et al. 2020), with its hook sites."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.resid_pre = HookPoint()  # created first so hook_names() lists sites in forward order
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=cfg.bias, dropout=cfg.dropout, position=cfg.position)
        self.norm1, self.norm2 = layer_norm(cfg), layer_norm(cfg)
        self.attn_out = HookPoint()  # before the MLP's own site, in forward order (no weights: init unchanged)
        self.mlp = MLP(cfg)
        self.drop = Dropout(cfg.dropout)
        self.mlp_out, self.resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor, keep, **attn_kw) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = self.resid_pre(x)
        if self.pre:
            a, probs = self.attn(self.norm1(x), keep, **attn_kw)
            x = x + self.attn_out(self.drop(a))
            x = x + self.mlp_out(self.drop(self.mlp(self.norm2(x))))
        else:
            a, probs = self.attn(x, keep, **attn_kw)
            x = self.norm1(x + self.attn_out(self.drop(a)))
            x = self.norm2(x + self.mlp_out(self.drop(self.mlp(x))))
        return self.resid_post(x), probs

    def forward_at(self, x: torch.Tensor, index: torch.Tensor, keep, **attn_kw) -> torch.Tensor:
        """The block's output at the positions `index` (B, Q) only, (B, T, D) -> (B, Q, D): every
        position still gives keys and values, but the queries, the output projection, the residual
        adds, the LayerNorms and the MLP run on the Q rows. Hooks are not called."""
        D = x.shape[-1]
        rows = x.gather(1, index[..., None].expand(*index.shape, D))  # (B, Q, D)
        if self.pre:
            a, _ = self.attn(self.norm1(x), keep, query_index=index, **attn_kw)
            rows = rows + self.drop(a)
            return rows + self.drop(self.mlp(self.norm2(rows)))
        a, _ = self.attn(x, keep, query_index=index, **attn_kw)
        rows = self.norm1(rows + self.drop(a))
        return self.norm2(rows + self.drop(self.mlp(rows)))


@torch.compiler.disable
def _selected_counts(select: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Selected positions per sequence (B,) and their maximum. Data-dependent, so kept out of
    torch.compile's graphs (the trainer's `compile`): the blocks before it compile with static
    shapes and the last block with a dynamic row count, without the warning `int(tensor)` gives."""
    counts = select.sum(1)
    return counts, (int(counts.max()) if counts.numel() else 0)


class Embeddings(nn.Module):
    """word + position (learned only) + segment embeddings -> LayerNorm (post-LN only) -> dropout
    (-> a projection E -> D when the tables are narrower than the model: ELECTRA, ALBERT).

    Learned positions add row t at token t, or with position_ids="roberta" the rows of
    `padding_position_ids(input_ids, pad_token_id)` (RoBERTa's ids, which depend on the padding)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        E = cfg.embedding_width
        self.word = nn.Embedding(cfg.vocab_size, E)
        self.position = nn.Embedding(cfg.position_rows, E) if cfg.position == "learned" else None
        self.padding_positions = cfg.pad_token_id if cfg.position_ids == "roberta" else None
        self.segment = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size > 0 else None
        self.norm = nn.LayerNorm(E, eps=cfg.layer_norm_eps, bias=cfg.bias) if cfg.norm == "post" else None
        self.drop = Dropout(cfg.dropout)
        self.project = nn.Linear(E, cfg.d_model, bias=cfg.bias) if E != cfg.d_model else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word(input_ids)  # (B, T, D)
        if self.position is not None and self.padding_positions is not None:
            x = x + self.position(padding_position_ids(input_ids, self.padding_positions))  # (B, T, D)
        elif self.position is not None:
            x = x + self.position.weight[: input_ids.shape[1]]  # (T, D) broadcast over B
        if self.segment is None and token_type_ids is not None:
            raise ValueError("token_type_ids given but EncoderConfig.type_vocab_size=0 (no segment embedding)")
        if self.segment is not None:
            x = x + (self.segment(token_type_ids) if token_type_ids is not None else self.segment.weight[0])
        if self.norm is not None:
            x = self.norm(x)
        x = self.drop(x)
        return x if self.project is None else self.project(x)


class MLMHead(nn.Module):
    """BERT's cls.predictions: LayerNorm(act(W h + b)) then a decoder to the vocabulary (+ bias);
    W maps D -> E (ELECTRA's generator head), so a tied decoder is the (V, E) word table."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        E = cfg.embedding_width
        self.dense = nn.Linear(cfg.d_model, E, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.norm = nn.LayerNorm(E, eps=cfg.layer_norm_eps, bias=cfg.bias)
        self.decoder = None if cfg.tie_embeddings else nn.Linear(E, cfg.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.bias else None


class RTDHead(nn.Module):
    """ELECTRA's discriminator head (Clark et al. 2020): per token, out(act(W h)) -> one logit,
    positive = replaced."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.out = nn.Linear(cfg.d_model, 1, bias=cfg.bias)


class Encoder(HookedModel, PrunableMixin, nn.Module):
    """BERT-style encoder. forward(input_ids (B, T), ...) -> EncoderOutput (see docs/design.md)."""

    kind = "encoder"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        cfg = config
        self.embeddings = Embeddings(cfg)
        self.embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = layer_norm(cfg) if cfg.norm == "pre" else None
        self.mlm = MLMHead(cfg)
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.nsp = nn.Linear(cfg.d_model, 2, bias=cfg.bias) if cfg.use_nsp else None
        self.rtd = RTDHead(cfg) if cfg.use_rtd else None
        self.apply(init_weights)
        self._tie_layers(cfg.share_layers)
        self._apply_config_pruning(cfg)  # after tying: pruning keeps shared attention weights tied
        self.name_hook_points()
        self.register_state_dict_post_hook(_drop_aliases)
        self.register_load_state_dict_pre_hook(_fill_aliases)
        self.register_load_state_dict_post_hook(_retie)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        attn_impl: str = "auto",
        unpad: bool = False,
    ) -> EncoderOutput:
        """unpad=True runs the position-wise layers on the real tokens only (`Packing`); the outputs
        are then zero at the padding (instead of vectors computed for [PAD] tokens)."""
        T = input_ids.shape[1]
        check_length(T, self.config.max_positions)
        self._check_head_mask(head_mask)
        packing = packing_for(self, attention_mask, unpad)
        eager = resolve_attn_impl(
            attn_impl, output_attentions=output_attentions, head_mask=head_mask, pattern_hooks=self._pattern_hooks_active()
        )
        keep, _ = keep_mask(attention_mask, T, input_ids.device, causal=False, explicit=eager)
        kw: dict[str, Any] = {"eager": eager, "packing": packing, **self._position_kw(T, input_ids.device)}
        x = self.embed(self.embeddings(input_ids, token_type_ids))  # (B, T, D)
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
        pooled = torch.tanh(self.pooler(last[:, 0]))  # (B, D) from [CLS]
        return EncoderOutput(
            last_hidden_state=last,
            pooler_output=pooled,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
        )

    def _position_kw(self, T: int, device: torch.device) -> dict[str, Any]:
        """The attention keywords of the position encoding: RoPE's (cos, sin) or ALiBi's distances."""
        if self.config.position == "rope":
            return {"rope": rope_cos_sin(T, self.config.d_model // self.config.n_heads, device)}
        if self.config.position == "alibi":
            return {"alibi_dist": alibi_distance(T, device)}  # symmetric -|i - j|
        return {}

    def masked_hidden(
        self, input_ids: torch.Tensor, select: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states at the positions `select` (B, T) bool marks, (M, D) in the order of
        `forward(...).last_hidden_state[select]`, for the masked-LM loss.

        Exact, and cheaper: only the selected positions' last-layer outputs reach the MLM loss, so
        the last block computes keys and values for every position but queries, output projection,
        MLP and LayerNorms for the selected rows only (a training step of the fp32 recipe's shape,
        4 x 256 at 25% masking, runs 1.13x as fast: docs/benchmarks.md). Sequences are padded to the
        largest count of selected positions in the batch; those extra rows are computed and dropped.
        SDPA path, no attention mask, and no hooks (refused: the last block's sites would see
        (B, Q, D) rows). The trainer calls `hidden_at` with fixed-size slots instead (no selection
        by a mask, no count read back)."""
        counts, Q = _selected_counts(select)  # (B,), max count
        # positions of the selected tokens first, in increasing order (a stable sort), then the rest
        index = torch.argsort((~select).to(torch.int8), dim=1, stable=True)[:, :Q]  # (B, Q)
        rows = self.hidden_at(input_ids, index, token_type_ids)  # (B, Q, D)
        return rows[torch.arange(Q, device=rows.device)[None, :] < counts[:, None]]  # (M, D)

    def hidden_at(
        self, input_ids: torch.Tensor, index: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states at the positions `index` (B, Q) long, (B, Q, D): `masked_hidden`'s
        last block at Q rows a sequence, with shapes that depend on (B, T, Q) only (the trainer's
        `MaskedSlots`, plmodels/training/masking.py). Same restrictions as `masked_hidden`."""
        T = input_ids.shape[1]
        check_length(T, self.config.max_positions)
        hooked = [name for name, p in self.hook_points().items() if p.fns]
        if hooked:
            raise ValueError(f"masked_hidden is a training path without hooks; remove the hooks on {hooked} or use forward")
        kw = self._position_kw(T, input_ids.device)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        for block in self.blocks[:-1]:
            x, _ = block(x, None, **kw)
        if index.shape[1] == 0:
            return x.new_zeros(x.shape[0], 0, x.shape[-1])
        rows = self.blocks[-1].forward_at(x, index, None, **kw)  # (B, Q, D)
        return rows if self.final_norm is None else self.final_norm(rows)

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., V): BERT's MLM transform and (tied) decoder; call on masked positions."""
        return F.linear(self.mlm_transform(hidden), *self.mlm_projection())

    def mlm_transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., E): LayerNorm(act(W h + b)), the MLM head before the vocabulary projection."""
        return self.mlm.norm(self.mlm.act(self.mlm.dense(hidden)))

    def mlm_projection(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight (V, E), bias (V,) or None) of the MLM vocabulary projection (tied by default; E = D unless
        factorised)."""
        weight = self.embeddings.word.weight if self.mlm.decoder is None else self.mlm.decoder.weight
        return weight, self.mlm.bias

    def rtd_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) final hidden states -> (...,) replaced-token logits (ELECTRA's discriminator)."""
        if self.rtd is None:
            raise ValueError("this encoder has no replaced-token-detection head (EncoderConfig.use_rtd=False)")
        return self.rtd.out(self.rtd.act(self.rtd.dense(hidden))).squeeze(-1)

    def _tie_layers(self, share_layers: str) -> None:
        """ALBERT's sharing: point the parameters of the `SHARED_PARTS` of blocks 1..L-1 at block 0's
        (again after a `load_state_dict(..., assign=True)`, which gives every key a new Parameter)."""
        for part in SHARED_PARTS[share_layers]:
            for block in self.blocks[1:]:
                tie_parameters(self.blocks[0].get_submodule(part), block.get_submodule(part))

    def parameter_aliases(self) -> dict[str, str]:
        """{name: first name} of every parameter also reached under an earlier name (`share_layers`:
        "blocks.2.attn.qkv.weight" -> "blocks.0.attn.qkv.weight"); empty for an unshared model."""
        first: dict[int, str] = {}
        aliases = {}
        for name, p in self.named_parameters(remove_duplicate=False):
            if id(p) in first:
                aliases[name] = first[id(p)]
            else:
                first[id(p)] = name
        return aliases

    def nsp_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, D) pooled [CLS] -> (B, 2) next-sentence logits (index 0 = "is next", as BERT)."""
        if self.nsp is None:
            raise ValueError("this encoder has no NSP head (EncoderConfig.use_nsp=False)")
        return self.nsp(pooled)


# A shared tensor is saved once, under its first name (safetensors refuses two names for one storage),
# and filled in under its other names before loading, so state_dict / load_state_dict / checkpoints
# need no special case; loading copies into the shared Parameter in place, which keeps the ties.
def _drop_aliases(module: Encoder, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    for name in module.parameter_aliases():
        state_dict.pop(prefix + name, None)


def _fill_aliases(module: Encoder, state_dict: dict, prefix: str, *_: Any) -> None:
    for name, first in module.parameter_aliases().items():
        key, source = prefix + name, prefix + first
        if source not in state_dict:
            continue  # reported as missing by load_state_dict
        if key in state_dict and not torch.equal(state_dict[key], state_dict[source]):
            raise ValueError(f"{key} differs from {source}, but this model shares one tensor between them "
                             f"(share_layers={module.config.share_layers!r})")
        state_dict[key] = state_dict[source]


def _retie(module: Encoder, incompatible_keys: Any) -> None:
    module._tie_layers(module.config.share_layers)
