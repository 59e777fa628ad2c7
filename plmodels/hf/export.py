"""Export a workbench checkpoint in the Hugging Face layout (the inverse of the importers).

    export_hf("runs/mine/models/mine", "exports/mine")      # -> Path("exports/mine")
    # then, anywhere transformers is installed:
    # AutoModelForMaskedLM.from_pretrained("exports/mine")   (encoders)
    # AutoModelForCausalLM.from_pretrained("exports/mine")   (decoders)
    # AutoTokenizer.from_pretrained("exports/mine")

Only what transformers computes *exactly* as our model is exported; anything else is a ValueError
that names the config field and why (nothing is approximated). Which layout:

| our model | HF layout | conditions (else refused) |
|---|---|---|
| Encoder, position_ids "index", type_vocab_size >= 1 | `BertForMaskedLM` (`BertForPreTraining` with an NSP head) | learned positions, post-LN, plain MLP, biases |
| Encoder, position_ids "roberta" | `RobertaForMaskedLM` | as BERT, and activation gelu (RoBERTa's LM head always applies gelu), type_vocab_size >= 1, no NSP head |
| Encoder, type_vocab_size 0 | `DistilBertForMaskedLM` | as BERT, and layer_norm_eps 1e-12 (fixed in DistilBERT's code), no NSP head |
| Encoder, position "rope" | `RoFormerForMaskedLM` | post-LN, plain MLP, even head size, no NSP head; biases or not; embedding_size allowed |
| Encoder, share_layers "all" | `AlbertForMaskedLM` (`AlbertForPreTraining` with an NSP head: ALBERT's sentence-order head) | as BERT; embedding_size allowed (E = D: an identity projection is written); no RTD head |
| Encoder, use_rtd | `ElectraForPreTraining` (the discriminator) | as BERT, share_layers "none", no NSP head; embedding_size allowed |
| Decoder | `GPT2LMHeadModel` | learned positions, pre-LN, plain MLP, biases, softmax output |
| Decoder, position "rope" | `GPTNeoXForCausalLM` | pre-LN, plain MLP, even head size, softmax output; biases or not; parallel residual or not; any rotary_dims / rope_base |

ALBERT: one group of one layer (num_hidden_groups = inner_group_num = 1) holds block 0's tensors,
which our blocks 1..L-1 share; share_layers "attention" / "ffn" share part of a block, which no
transformers class computes: refused. ALBERT always projects E -> D (`embedding_hidden_mapping_in`):
an unfactorised model gets the identity with a zero bias (exact), which the importer drops again.
Its MLM head applies hidden_act (our activation), its sentence-order head sits on the pooled [CLS]
with index 0 = original order, as our NSP head under `sop_pairs`. ELECTRA: ElectraForPreTraining's
discriminator head (dense D -> D, hidden_act, dense_prediction D -> 1) is our `rtd`; it has no MLM
head and no pooler, so ours are dropped (warned, noted).

Refused everywhere: pruned heads (transformers 5 has no `pruned_heads`, and BERT / GPT-2 need
n_heads x head_dim = hidden size), ALiBi, gated MLPs, no biases (but for the RoPE layouts), pre-LN
encoders, post-LN decoders, the adaptive softmax, and any config field this module does not know at
a non-default value (a field added later is never dropped silently; `embedding_size` is known to the
RoFormer, ALBERT and ELECTRA layouts only).

RoPE (ours: `components.positions`, rotate-half pairs (i, i + Dh/2), angle pos * 10000^(-2i/Dh),
every channel):
- RoFormer rotates the interleaved pairs (2i, 2i+1) by the same angles. The rows of each head's
  query and key projections (and biases) are permuted, new channel 2i <- our i, 2i+1 <- our
  i + Dh/2 (`rope_pair_permutation`): q and k are permuted alike, so every score q . k is unchanged;
  values untouched (rotary_value false). Its sin / cos table `encoder.embed_positions.weight` is a
  stored weight: ours is written (`roformer_positions`; transformers' own, computed in float64,
  differs by up to 2e-5 at 512 positions). RoFormer has no absolute positions and no pooler (ours is
  dropped, with a warning and a note); type_vocab_size 0 is written as one all-zero token-type row
  (RoFormer's default token_type_ids are 0); an E -> D projection is `roformer.embeddings_project`.
- GPT-NeoX rotates as ours (rotate-half pairs over the first R channels of each head): rotary_pct =
  R / head_dim (our `rotary_dims`, all channels by default; refused when transformers'
  int(head_dim x rotary_pct) would not give R back), rotary_emb_base = our `rope_base`,
  use_parallel_residual = our `parallel_residual`; its fused `query_key_value` holds per head
  [q_h; k_h; v_h], so our rows [q; k; v] are regrouped by head. Its inverse frequencies are
  recomputed on load (1 / base^(2i/R), within an ulp of ours).
- Both always have biases (Linear and LayerNorm; RoFormer's MLM bias too): a bias=False model gets
  zeros, which compute exactly what no bias computes.

What each layout holds beyond the MLM / LM function:
- BERT: the pooler is written (`bert.pooler.*`): BertForMaskedLM has none and reports it as
  unused, `BertModel.from_pretrained` reads it. With `use_nsp` the folder is a `BertForPreTraining`
  (architectures), whose `cls.seq_relationship` holds our NSP head; AutoModelForMaskedLM reads it too.
- RoBERTa: the pooler is written (`roberta.pooler.*`), as for BERT.
- DistilBERT and RoFormer have no pooler: ours is dropped, with a warning and a note in the folder's README.md.

Weights (model.safetensors, metadata format=pt) use HF's names: our fused QKV (rows [q; k; v]) is
split into query / key / value (BERT, RoBERTa, RoFormer: `attention.self.*`; DistilBERT: `q_lin/k_lin/v_lin`);
GPT-2's Conv1D weights (c_attn, c_proj, c_fc) are written (in, out), the transpose of ours. A tied
head writes no decoder / lm_head matrix (transformers ties it: tie_word_embeddings=true); an untied
one writes its own. BERT's and RoBERTa's MLM bias is written twice, as the head's bias and as
`decoder.bias` (transformers 5 ties the two only when it ties the weights). The importers (`bert.import_hf_bert`, `encoders.import_hf_roberta` /
`import_hf_distilbert`, `gpt2.import_hf_gpt2`) read an export back into the same state dict
(DistilBERT: but the pooler), and `gpt_neox.import_hf_gpt_neox` each GPT-NeoX export; there is no
RoFormer importer.

Tokenizer files, when the checkpoint has a tokenizer: `tokenizer.json` (ours, padding and
truncation off), `tokenizer_config.json` and `special_tokens_map.json` with the special tokens of
our roles and the class (`BertTokenizerFast` with do_lower_case for WordPiece, plus `vocab.txt`;
`RobertaTokenizerFast` for a BPE with cls and sep roles; else `GPT2TokenizerFast`).
`AutoTokenizer.from_pretrained` then gives our `encode` ids (with and without specials); it follows
tokenizer_class before the model type (so a RoFormer folder gets BertTokenizerFast, not RoFormer's
jieba tokenizer, and a GPT-NeoX folder GPT2TokenizerFast).

The folder is built in a temporary sibling and renamed into place (files.temp_folder /
replace_folder): a reader never sees half an export; an existing folder at `out_dir` is replaced.
Nothing here imports `transformers`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from ..checkpoint import CONFIG_FILE, MODEL_KINDS, TOKENIZER_DIR, load
from ..components.positions import rope_cos_sin
from ..files import replace_folder, save_safetensors, temp_folder
from .encoders import ALBERT, DISTILBERT, ELECTRA, ROBERTA
from .gpt2 import GPT2_CONV1D, GPT2_RENAMES
from .gpt_neox import NEOX_RENAMES as NEOX_IMPORT_RENAMES
from .bert import RENAMES as BERT_RENAMES
from ..tokenizer import _precompiled_charsmap, albert_pipeline

__all__ = ["export_hf", "hf_layout", "hf_state", "rope_pair_permutation", "roformer_positions", "tokenizer_files"]

# our activation -> the HF name of exactly that function (gelu_pytorch_tanh is F.gelu(approximate="tanh");
# GPT-2 keeps its own name, gelu_new, the same function written out: they differ by < 1e-7)
BERT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
DISTILBERT_EPS = 1e-12  # hard-coded in transformers' DistilBERT

# HF name (after the family prefix) -> ours, {l} a layer index; q/k/v are handled apart (QKV_SPLIT)
# the importers' tables (encoders' families), plus the untied vocabulary projection they treat apart
ROBERTA_RENAMES = {**ROBERTA.renames, "lm_head.bias": "mlm.bias", "lm_head.decoder.weight": "mlm.decoder.weight"}
DISTILBERT_RENAMES = {**DISTILBERT.renames, "vocab_projector.weight": "mlm.decoder.weight"}
BERT_EXPORT_RENAMES = {**BERT_RENAMES, "cls.predictions.decoder.weight": "mlm.decoder.weight"}
# RoFormer: BERT's names without the position table, pooler and NSP head, plus the E -> D projection
ROFORMER_RENAMES = {
    **{k: v for k, v in BERT_EXPORT_RENAMES.items()
       if not k.startswith(("pooler.", "cls.seq_relationship.", "embeddings.position_embeddings."))},
    "embeddings_project.weight": "embeddings.project.weight",
    "embeddings_project.bias": "embeddings.project.bias",
}
ALBERT_RENAMES = {**ALBERT.renames, "predictions.bias": "mlm.bias", "predictions.decoder.weight": "mlm.decoder.weight"}
ELECTRA_RENAMES = dict(ELECTRA.renames)  # the generator's names too: unused, the discriminator drops our MLM head
# family -> (renames, prefix of the base model's names, heads outside the prefix, q/k/v names)
FAMILIES: dict[str, tuple[dict[str, str], str, tuple[str, ...], str]] = {
    "bert": (BERT_EXPORT_RENAMES, "bert.", ("cls.",), "encoder.layer.{l}.attention.self.{part}.{kind}"),
    "roberta": (ROBERTA_RENAMES, "roberta.", ("lm_head.",), "encoder.layer.{l}.attention.self.{part}.{kind}"),
    "distilbert": (DISTILBERT_RENAMES, "distilbert.", ("vocab_",), "transformer.layer.{l}.attention.{part}.{kind}"),
    "gpt2": (GPT2_RENAMES, "transformer.", (), ""),
    "roformer": (ROFORMER_RENAMES, "roformer.", ("cls.",), "encoder.layer.{l}.attention.self.{part}.{kind}"),
    # block 0 only: a share_layers="all" state dict holds each shared tensor once, under block 0's name
    "albert": (ALBERT_RENAMES, "albert.", ALBERT.heads,
               "encoder.albert_layer_groups.0.albert_layers.{l}.attention.{part}.{kind}"),
    "electra": (ELECTRA_RENAMES, "electra.", ELECTRA.heads, "encoder.layer.{l}.attention.self.{part}.{kind}"),
}
QKV_PARTS = {"bert": ("query", "key", "value"), "roberta": ("query", "key", "value"),
             "distilbert": ("q_lin", "k_lin", "v_lin"), "roformer": ("query", "key", "value"),
             "albert": ("query", "key", "value"), "electra": ("query", "key", "value")}
# our tensors a layout has no place for (noted, with a warning)
DROPPED = {"distilbert": ("pooler.",), "roformer": ("pooler.",), "electra": ("pooler.", "mlm.")}
ZERO_BIASES = ("roformer", "gpt_neox")  # layouts that take a model without biases (bias=False): zeros are written
# our weights that are not those of a Linear / LayerNorm with a bias slot in these layouts
NO_BIAS_SLOT = re.compile(r"^(embeddings\.(word|segment|position)\.weight|mlm\.decoder\.weight|pooler\..*|nsp\..*"
                          r"|wte\.weight|lm_head\.weight)$")

# GPT-NeoX (pre-LN): the fused query_key_value is per head [q_h; k_h; v_h] (hf_state reorders ours)
# the importer's names, and the LM head under the name transformers 5 writes
NEOX_RENAMES = {**NEOX_IMPORT_RENAMES, "lm_head.weight": "lm_head.weight"}
FAMILIES["gpt_neox"] = (NEOX_RENAMES, "gpt_neox.", ("lm_head.",), "")

# every config field this module has looked at; another field at a non-default value is refused
ENCODER_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "position", "norm",
                  "activation", "mlp", "bias", "dropout", "layer_norm_eps", "tie_embeddings", "type_vocab_size",
                  "use_nsp", "pad_token_id", "pruned_heads", "position_ids"}
DECODER_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "position", "norm",
                  "activation", "mlp", "bias", "dropout", "layer_norm_eps", "tie_embeddings", "output",
                  "adaptive_cutoffs", "adaptive_div", "pruned_heads", "parallel_residual", "rotary_dims", "rope_base"}


def _refuse(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"cannot export to the Hugging Face layout: {field}={value!r}: {why}")


def _check_known_fields(config: Any, known: set[str]) -> None:
    for f in dataclasses.fields(config):
        if f.name in known:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        value = getattr(config, f.name)
        if default is dataclasses.MISSING or value != default:
            raise _refuse(f.name, value, "the exporter does not know this field, so it cannot tell whether "
                                         "transformers computes it; not exported rather than approximated")


# the LayerNorm placement of the Hugging Face families each exportable kind maps to
EXPORT_NORM = {"encoder": ("post", "BERT-family encoders (RoFormer too) are post-LN"),
               "decoder": ("pre", "GPT-2 and GPT-NeoX are pre-LN")}


def _check_common(config: Any, kind: str, rope: bool = False) -> None:
    """The refusals shared by every family (see the module docstring); `rope`: the RoPE layout
    (RoFormer, GPT-NeoX), which takes position "rope" instead of "learned" and a model without biases."""
    pruned = {int(l): list(h) for l, h in (config.pruned_heads or {}).items() if h}
    if pruned:
        counts = {config.n_heads - len(h) for h in pruned.values()}
        if len(pruned) < config.n_layers:
            counts.add(config.n_heads)
        why = ("different head counts per layer" if len(counts) > 1 else "fewer heads than d_model / head_dim")
        raise _refuse("pruned_heads", pruned, f"pruned heads give {why}; transformers 5 has no pruned_heads and its "
                                              "BERT / GPT-2 need n_heads x head_dim = hidden size")
    if config.position == "rope" and not rope:
        raise _refuse("position", "rope", "RoPE export is built for post-LN encoders (RoFormer) and pre-LN decoders "
                                          "(GPT-NeoX) only")
    if config.position != ("rope" if rope else "learned"):
        raise _refuse("position", config.position, "BERT, RoBERTa, DistilBERT and GPT-2 only have learned absolute "
                                                   "positions, RoFormer and GPT-NeoX only RoPE")
    if config.mlp != "plain":
        raise _refuse("mlp", config.mlp, "a gated MLP has no place in BERT / RoFormer / GPT-2 / GPT-NeoX (plain MLP only)")
    if not config.bias and not rope:
        raise _refuse("bias", config.bias, "BERT / GPT-2 always have biases in linear layers and LayerNorms")
    if config.activation not in BERT_ACTIVATIONS:
        raise _refuse("activation", config.activation, f"no Hugging Face name known; known: {sorted(BERT_ACTIVATIONS)}")
    want, what = EXPORT_NORM[kind]
    if config.norm != want:
        raise _refuse("norm", config.norm, f"{what}; a {config.norm}-LN {kind} has no Hugging Face layout here")


def _shared_or_rtd_family(config: Any) -> str:
    """"albert" (share_layers "all") | "electra" (use_rtd) for an exportable EncoderConfig, else a
    ValueError naming the field."""
    if config.share_layers not in ("none", "all"):
        raise _refuse("share_layers", config.share_layers, "ALBERT shares whole layers (share_layers 'all'); no "
                                                           "transformers class shares only the attention or the FFN")
    albert = config.share_layers == "all"
    if albert and config.use_rtd:
        raise _refuse("use_rtd", True, "ALBERT has no replaced-token-detection head, and ELECTRA no shared layers")
    _check_known_fields(config, ENCODER_FIELDS | {"embedding_size", "share_layers", "use_rtd"})
    _check_common(config, "encoder")
    name = "ALBERT" if albert else "ELECTRA"
    if config.position_ids != "index":
        raise _refuse("position_ids", config.position_ids, f"{name} counts positions from 0 ('index')")
    if config.type_vocab_size < 1:
        raise _refuse("type_vocab_size", 0, f"{name} has a token-type embedding (type_vocab_size >= 1)")
    if config.use_nsp and not albert:
        raise _refuse("use_nsp", True, "ElectraForPreTraining has no next-sentence head")
    return "albert" if albert else "electra"


def _encoder_family(config: Any) -> str:
    """"bert" | "roberta" | "distilbert" | "roformer" | "albert" | "electra" for an exportable
    EncoderConfig, else a ValueError naming the field."""
    if config.position == "rope":  # RoFormer: its own embeddings_project takes a factorised embedding
        _check_known_fields(config, ENCODER_FIELDS | {"embedding_size"})
        _check_common(config, "encoder", rope=True)
        if config.use_nsp:
            raise _refuse("use_nsp", True, "RoFormer has no next-sentence head (only BERT's BertForPreTraining)")
        if config.d_model % config.n_heads or (config.d_model // config.n_heads) % 2:
            raise _refuse("n_heads", config.n_heads, "RoFormer rotates pairs of channels: the head size "
                                                     "d_model / n_heads must be an even integer")
        return "roformer"
    if config.share_layers != "none" or config.use_rtd:
        return _shared_or_rtd_family(config)
    _check_known_fields(config, ENCODER_FIELDS)
    _check_common(config, "encoder")
    if config.position_ids == "roberta":
        if config.type_vocab_size < 1:
            raise _refuse("type_vocab_size", 0, "RoBERTa has a token-type embedding (type_vocab_size >= 1)")
        if config.activation != "gelu":
            raise _refuse("activation", config.activation, "RoBERTa's LM head applies gelu whatever hidden_act says, "
                                                           "and our MLM head uses the encoder's activation")
        family = "roberta"
    elif config.position_ids != "index":
        raise _refuse("position_ids", config.position_ids, "only 'index' (BERT, DistilBERT) and 'roberta' export")
    elif config.type_vocab_size == 0:
        if config.layer_norm_eps != DISTILBERT_EPS:
            raise _refuse("layer_norm_eps", config.layer_norm_eps, "an encoder without token types exports as "
                                                                   f"DistilBERT, whose LayerNorm eps is fixed at {DISTILBERT_EPS}")
        family = "distilbert"
    else:
        family = "bert"
    if config.use_nsp and family != "bert":
        raise _refuse("use_nsp", True, f"{family} has no next-sentence head (only BERT's BertForPreTraining)")
    return family


def _decoder_family(config: Any) -> str:
    """"gpt2" (learned positions) | "gpt_neox" (RoPE) for an exportable DecoderConfig."""
    _check_known_fields(config, DECODER_FIELDS)
    if config.output != "softmax":
        raise _refuse("output", config.output, "GPT-2's / GPT-NeoX's LM head is a full softmax; the adaptive softmax "
                                               "has no Hugging Face layout")
    rope = config.position == "rope"
    _check_common(config, "decoder", rope=rope)
    if rope and (config.d_model % config.n_heads or (config.d_model // config.n_heads) % 2):
        raise _refuse("n_heads", config.n_heads, "RoPE rotates pairs of channels: the head size d_model / n_heads "
                                                 "must be an even integer")
    if config.parallel_residual and not rope:
        raise _refuse("parallel_residual", True, "GPT-2's blocks are sequential; only the GPT-NeoX layout (RoPE) has "
                                                 "a parallel residual")
    if rope and int(config.d_model // config.n_heads * _rotary_pct(config)) != config.rope_dims:
        raise _refuse("rotary_dims", config.rotary_dims, "transformers rotates int(head_dim x rotary_pct) channels, "
                                                         "and no float rotary_pct gives this number back")
    return "gpt_neox" if rope else "gpt2"


def _rotary_pct(config: Any) -> float:
    """GPT-NeoX's rotary_pct of a RoPE DecoderConfig: the fraction of each head that is rotated."""
    return config.rope_dims / (config.d_model // config.n_heads)


def _token_id(tokenizer: Any, role: str) -> int | None:
    return None if tokenizer is None else getattr(tokenizer, f"{role}_id", None)


def hf_layout(kind: str, config: Any, tokenizer: Any = None) -> tuple[str, dict]:
    """(family, HF config.json dict) of our model `kind` ("encoder" | "decoder") and config (a
    dataclass); a ValueError naming the field for anything transformers would not compute exactly."""
    if kind not in LAYOUTS:
        raise ValueError(f"model kind {kind!r} has no Hugging Face layout here; exportable: {sorted(LAYOUTS)} "
                         f"(known kinds: {sorted(MODEL_KINDS)})")
    return LAYOUTS[kind](config, tokenizer)


def _decoder_layout(c: Any, tokenizer: Any) -> tuple[str, dict]:
    """GPT-2 or GPT-NeoX (RoPE) for a DecoderConfig."""
    family = _decoder_family(c)
    if family == "gpt_neox":
        return family, {
            "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
            "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
            "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
            "hidden_act": BERT_ACTIVATIONS[c.activation], "max_position_embeddings": c.max_positions,
            "layer_norm_eps": c.layer_norm_eps, "hidden_dropout": c.dropout, "attention_dropout": c.dropout,
            "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
            "use_parallel_residual": c.parallel_residual, "attention_bias": True,  # bias=False: zeros are written
            # transformers 5 reads rope_parameters, earlier ones rotary_*
            "rotary_pct": _rotary_pct(c), "rotary_emb_base": c.rope_base,
            "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_base,
                                "partial_rotary_factor": _rotary_pct(c)},
            "use_cache": True,
            "bos_token_id": _token_id(tokenizer, "bos"), "eos_token_id": _token_id(tokenizer, "eos"),
            "pad_token_id": None,  # batches pad under the attention mask
        }
    return family, {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": c.vocab_size, "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads,
        "n_inner": c.d_ff, "n_positions": c.max_positions, "activation_function": GPT2_ACTIVATIONS[c.activation],
        "layer_norm_epsilon": c.layer_norm_eps, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout, "initializer_range": 0.02, "tie_word_embeddings": c.tie_embeddings,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "add_cross_attention": False, "use_cache": True,
        "bos_token_id": _token_id(tokenizer, "bos"), "eos_token_id": _token_id(tokenizer, "eos"),
        "pad_token_id": None,  # GPT-2 has none; batches pad under the attention mask
    }


def _encoder_layout(c: Any, tokenizer: Any) -> tuple[str, dict]:
    """BERT, RoBERTa, DistilBERT, RoFormer, ALBERT or ELECTRA for an EncoderConfig."""
    family = _encoder_family(c)
    if family in ("albert", "electra"):
        hf = {
            "model_type": family, "vocab_size": c.vocab_size, "embedding_size": c.embedding_width,
            "hidden_size": c.d_model, "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads,
            "intermediate_size": c.d_ff, "hidden_act": BERT_ACTIVATIONS[c.activation], "hidden_dropout_prob": c.dropout,
            "attention_probs_dropout_prob": c.dropout, "max_position_embeddings": c.max_positions,
            "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.layer_norm_eps, "initializer_range": 0.02,
            "position_embedding_type": "absolute", "pad_token_id": c.pad_token_id,
            "tie_word_embeddings": c.tie_embeddings,
        }
        if family == "albert":
            hf.update(architectures=["AlbertForPreTraining" if c.use_nsp else "AlbertForMaskedLM"],
                      num_hidden_groups=1, inner_group_num=1, classifier_dropout_prob=c.dropout)
        else:
            hf.update(architectures=["ElectraForPreTraining"], is_decoder=False, add_cross_attention=False)
        return family, hf
    if family == "roformer":
        return family, {
            "architectures": ["RoFormerForMaskedLM"], "model_type": "roformer",
            "vocab_size": c.vocab_size, "embedding_size": c.embedding_width, "hidden_size": c.d_model,
            "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
            "hidden_act": BERT_ACTIVATIONS[c.activation], "hidden_dropout_prob": c.dropout,
            "attention_probs_dropout_prob": c.dropout, "max_position_embeddings": c.max_positions,
            # no segment embedding: one all-zero row, which RoFormer adds at its default token_type_ids 0
            "type_vocab_size": max(c.type_vocab_size, 1), "layer_norm_eps": c.layer_norm_eps,
            "initializer_range": 0.02, "rotary_value": False, "pad_token_id": c.pad_token_id,
            "tie_word_embeddings": c.tie_embeddings, "is_decoder": False, "add_cross_attention": False,
            "use_cache": False,
        }
    if family == "distilbert":
        return family, {
            "architectures": ["DistilBertForMaskedLM"], "model_type": "distilbert",
            "vocab_size": c.vocab_size, "dim": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads,
            "hidden_dim": c.d_ff, "max_position_embeddings": c.max_positions, "sinusoidal_pos_embds": False,
            "activation": BERT_ACTIVATIONS[c.activation], "dropout": c.dropout, "attention_dropout": c.dropout,
            "initializer_range": 0.02, "pad_token_id": c.pad_token_id, "tie_word_embeddings": c.tie_embeddings,
        }
    hf = {
        "architectures": ["BertForPreTraining" if c.use_nsp else "BertForMaskedLM"] if family == "bert"
        else ["RobertaForMaskedLM"],
        "model_type": family,
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff, "hidden_act": BERT_ACTIVATIONS[c.activation],
        "hidden_dropout_prob": c.dropout, "attention_probs_dropout_prob": c.dropout,
        "max_position_embeddings": c.position_rows,  # RoBERTa: max_positions + pad_token_id + 1
        "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.layer_norm_eps, "initializer_range": 0.02,
        "position_embedding_type": "absolute", "pad_token_id": c.pad_token_id,
        "tie_word_embeddings": c.tie_embeddings, "is_decoder": False, "add_cross_attention": False,
    }
    if family == "roberta":
        hf.update(bos_token_id=_token_id(tokenizer, "bos"), eos_token_id=_token_id(tokenizer, "eos"))
    return family, hf


LAYOUTS = {"encoder": _encoder_layout, "decoder": _decoder_layout}  # exportable kind -> its HF layouts


def _inverse(renames: dict[str, str]) -> tuple[dict[str, str], list[tuple[re.Pattern, str]]]:
    """ours -> HF name: exact names, and (pattern on ours, HF template) for per-layer names."""
    exact, templated = {}, []
    for hf, ours in renames.items():
        if "{l}" in ours:
            templated.append((re.compile("^" + re.escape(ours).replace(r"\{l\}", r"(\d+)") + "$"), hf))
        else:
            exact[ours] = hf
    return exact, templated


def rope_pair_permutation(head_dim: int) -> torch.Tensor:
    """perm (Dh,) with new channel j <- our channel perm[j]: 2i <- i, 2i+1 <- i + Dh/2. Our RoPE rotates
    the pairs (i, i + Dh/2) ("rotate half"), RoFormer's the pairs (2i, 2i+1) ("interleaved"), each pair by
    the same angle pos * 10000^(-2i/Dh); the same permutation of q's and k's channels leaves every
    score q . k unchanged, so permuting the rows of the q and k projections per head is exact."""
    half = torch.arange(head_dim // 2)
    return torch.stack((half, half + head_dim // 2), dim=1).flatten()


def roformer_positions(max_positions: int, head_dim: int) -> torch.Tensor:
    """RoFormer's `encoder.embed_positions.weight` (max_positions, Dh) = [sin | cos] of the angles
    pos * theta_i, i < Dh/2, computed by our rope_cos_sin (fp32), so both rotate by the same numbers
    (transformers' own table, computed in float64 and rounded, differs by a few ulps)."""
    cos, sin = rope_cos_sin(max_positions, head_dim)
    return torch.cat((sin[:, : head_dim // 2], cos[:, : head_dim // 2]), dim=1).contiguous()


def _with_zero_biases(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A bias=False state dict with the biases a layout always has, as zeros (adding 0 is exact): every
    Linear / LayerNorm weight's, and the MLM bias (the vocabulary size: the word table's rows)."""
    out = dict(state)
    for name, tensor in state.items():
        if name.endswith(".weight") and not NO_BIAS_SLOT.match(name):
            out.setdefault(name[: -len("weight")] + "bias", tensor.new_zeros(tensor.shape[0]))
    if "embeddings.word.weight" in state:
        out.setdefault("mlm.bias", state["embeddings.word.weight"].new_zeros(state["embeddings.word.weight"].shape[0]))
    return out


def hf_state(family: str, state: dict[str, torch.Tensor], config: Any = None) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Our state dict -> (HF state dict of `family`, our tensors the layout drops). Every other
    tensor must find its HF name (else a ValueError naming it: a tensor is never dropped silently).
    RoFormer and GPT-NeoX need our `config` (heads, positions)."""
    renames, prefix, heads, qkv = FAMILIES[family]
    if family in ZERO_BIASES:
        state = _with_zero_biases(state)
    if family == "roformer":
        if config is None:
            raise ValueError("hf_state('roformer', ...) needs the model's config (heads, positions)")
        Dh = config.d_model // config.n_heads
        perm = rope_pair_permutation(Dh)
        state = dict(state)
        for name in [n for n in state if re.match(r"^blocks\.\d+\.attn\.qkv\.(weight|bias)$", n)]:
            q, k, v = state[name].chunk(3, dim=0)  # rows [q; k; v], each H heads x Dh channels
            q, k = (t.reshape(config.n_heads, Dh, *t.shape[1:])[:, perm].reshape(t.shape) for t in (q, k))
            state[name] = torch.cat((q, k, v), dim=0)
        if "embeddings.segment.weight" not in state:  # type_vocab_size 0: one zero row (token type 0)
            word = state["embeddings.word.weight"]
            state["embeddings.segment.weight"] = word.new_zeros(1, word.shape[1])
    if family == "gpt_neox":  # rows [q; k; v] (each H heads x Dh) -> per head [q_h; k_h; v_h]
        if config is None:
            raise ValueError("hf_state('gpt_neox', ...) needs the model's config (heads)")
        H = config.n_heads
        state = dict(state)
        for name in [n for n in state if re.match(r"^blocks\.\d+\.attn\.qkv\.(weight|bias)$", n)]:
            t = state[name]
            state[name] = t.reshape(3, H, t.shape[0] // (3 * H), *t.shape[1:]).transpose(0, 1).reshape(t.shape)
    if family == "albert" and "embeddings.project.weight" not in state:  # E = D: ALBERT still projects
        word = state["embeddings.word.weight"]
        D = word.shape[1]
        state = {**state, "embeddings.project.weight": torch.eye(D, dtype=word.dtype),
                 "embeddings.project.bias": word.new_zeros(D)}
    exact, templated = _inverse(renames)
    out: dict[str, torch.Tensor] = {}
    dropped, unplaced = [], []

    def put(name: str, tensor: torch.Tensor) -> None:
        full = name if name.startswith(heads) or family == "gpt2" and name == "lm_head.weight" else prefix + name
        out[full] = tensor.detach().cpu().contiguous()

    for ours, tensor in state.items():
        if ours.startswith(DROPPED.get(family, ())):
            dropped.append(ours)
            continue
        if family == "gpt2" and ours == "lm_head.weight":
            put("lm_head.weight", tensor)
            continue
        m = re.match(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", ours) if family in QKV_PARTS else None
        if m:
            for part, piece in zip(QKV_PARTS[family], tensor.chunk(3, dim=0)):  # rows [q; k; v]
                put(qkv.format(l=m[1], part=part, kind=m[2]), piece.clone())
            continue
        name = exact.get(ours)
        if name is None:
            for pattern, template in templated:
                if mm := pattern.match(ours):
                    name = template.format(l=mm[1])
                    break
        if name is None:
            unplaced.append(ours)
            continue
        if family == "gpt2" and GPT2_CONV1D.match(name):
            tensor = tensor.t()  # Linear (out, in) -> Conv1D (in, out)
        put(name, tensor)
    if unplaced:
        raise ValueError(f"cannot export to the Hugging Face {family} layout: no place for our tensors {unplaced}")
    if family == "roformer":
        out["roformer.encoder.embed_positions.weight"] = roformer_positions(config.max_positions, Dh)
    # transformers 5 ties the vocabulary projection's bias to the head's bias only when it ties the
    # weights: an untied head would get a fresh decoder.bias, so the copy is written (the importers
    # read the head's bias and check or ignore the copy)
    for bias, copy in (("cls.predictions.bias", "cls.predictions.decoder.bias"), ("lm_head.bias", "lm_head.decoder.bias"),
                       ("predictions.bias", "predictions.decoder.bias")):
        if bias in out:
            out[copy] = out[bias].clone()
    return out, dropped


# ------------------------------------------------------------------------------------ tokenizer
def _albert_tokenizer_flags(hf: Any) -> dict[str, bool]:
    """tokenizer_config.json flags (do_lower_case, keep_accents, add_prefix_space) from which transformers'
    AlbertTokenizer rebuilds exactly our Unigram tokenizer's normalizer and pre-tokenizer (it ignores
    tokenizer.json's own, and puts <unk> at id 1); a ValueError when no flags do."""
    spec = json.loads(hf.to_str())
    if spec.get("model", {}).get("unk_id") != 1:
        raise ValueError(f"cannot export the Unigram tokenizer: its unk_id is {spec.get('model', {}).get('unk_id')!r}, "
                         "and transformers' AlbertTokenizer puts <unk> at id 1")
    charsmap = _precompiled_charsmap(spec)
    for lower, keep, prefix in ((a, b, c) for a in (True, False) for b in (False, True) for c in (True, False)):
        probe = HFTokenizer(models.Unigram([("<unk>", 0.0)], unk_id=0))
        probe.normalizer, probe.pre_tokenizer, _ = albert_pipeline(lower, keep, prefix, charsmap)
        built = json.loads(probe.to_str())
        if (built["normalizer"], built["pre_tokenizer"]) == (spec.get("normalizer"), spec.get("pre_tokenizer")):
            return {"do_lower_case": lower, "keep_accents": keep, "add_prefix_space": prefix}
    raise ValueError("cannot export the Unigram tokenizer: transformers' AlbertTokenizer rebuilds its normalizer and "
                     "pre-tokenizer from do_lower_case / keep_accents / add_prefix_space, and no setting gives ours")


def tokenizer_files(tokenizer: Any, max_length: int) -> dict[str, str]:
    """File name -> text of the HF tokenizer files of our Tokenizer (see the module docstring)."""
    from tokenizers import Tokenizer as HFTokenizer  # the same library our Tokenizer wraps

    hf = HFTokenizer.from_str(tokenizer.hf.to_str())  # a copy: the caller's tokenizer is left as it is
    hf.no_padding()
    hf.no_truncation()
    specials = {f"{role}_token": token for role, token in sorted(tokenizer.specials.items())}
    files: dict[str, str] = {"tokenizer.json": hf.to_str(pretty=True)}
    tok_cfg: dict[str, Any] = {"model_max_length": max_length, "clean_up_tokenization_spaces": False, **specials}
    if tokenizer.kind == "wordpiece":
        vocab = hf.get_vocab(with_added_tokens=True)
        by_id = sorted(vocab.items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise ValueError("cannot write vocab.txt: the WordPiece ids are not 0 .. V-1 without gaps")
        bad = [t for t, _ in by_id if "\n" in t or "\r" in t]
        if bad:
            raise ValueError(f"cannot write vocab.txt: tokens with a line break {bad[:3]}")
        files["vocab.txt"] = "".join(t + "\n" for t, _ in by_id)
        tok_cfg.update(tokenizer_class="BertTokenizerFast", do_lower_case=tokenizer.lowercase,
                       strip_accents=None, tokenize_chinese_chars=True)
    elif tokenizer.kind == "unigram":
        tok_cfg.update(tokenizer_class="AlbertTokenizer", **_albert_tokenizer_flags(hf))
    else:
        spec = json.loads(hf.to_str())
        prefix_space = bool((spec.get("pre_tokenizer") or {}).get("add_prefix_space", False))
        roberta = "cls" in tokenizer.specials and "sep" in tokenizer.specials
        tok_cfg.update(tokenizer_class="RobertaTokenizerFast" if roberta else "GPT2TokenizerFast",
                       add_prefix_space=prefix_space)
        if not roberta:  # our add_special prepends bos (Tokenizer.special_affixes)
            tok_cfg["add_bos_token"] = "bos" in tokenizer.specials
    files["tokenizer_config.json"] = json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n"
    files["special_tokens_map.json"] = json.dumps(specials, indent=2, sort_keys=True) + "\n"
    return files


# ------------------------------------------------------------------------------------ export
def _readme(src: Path, family: str, hf_cfg: dict, notes: list[str]) -> str:
    lines = [f"# {src.name}", "", f"Exported by plm-workbench (plmodels.hf.export) from `{src}` as "
             f"`{hf_cfg['architectures'][0]}` (model_type `{family}`).", ""]
    lines += ["## Notes", ""] + ([f"- {n}" for n in notes] or ["- nothing was dropped: the export computes what the checkpoint computes"])
    return "\n".join(lines) + "\n"


def export_hf(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the checkpoint at `checkpoint_dir` in the Hugging Face layout at `out_dir`; returns it.

    A ValueError naming the config field for a model transformers would not compute exactly (module
    docstring); the config is checked before any weight is read. `out_dir` is replaced atomically.
    """
    src, out = Path(checkpoint_dir), Path(out_dir)
    if not (src / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{src} is not a checkpoint folder (no {CONFIG_FILE})")
    meta = json.loads((src / CONFIG_FILE).read_text(encoding="utf-8"))
    kind = meta.get("kind") if isinstance(meta, dict) else None
    if kind not in MODEL_KINDS:
        raise ValueError(f"{src / CONFIG_FILE}: unknown model kind {kind!r}; known: {sorted(MODEL_KINDS)}")
    config = MODEL_KINDS[kind][1].from_dict(meta.get("config", {}), str(src / CONFIG_FILE))
    try:
        hf_layout(kind, config)  # refuse before reading the weights
    except ValueError as e:
        raise ValueError(f"{src}: {e}") from None
    model, tokenizer = load(src)
    family, hf_cfg = hf_layout(kind, model.config, tokenizer)
    state, dropped = hf_state(family, model.state_dict(), model.config)
    notes = []
    if family == "roformer":
        notes.append("RoPE: the rows of each head's query and key projections are permuted (channel 2i <- our i, "
                     "2i+1 <- our i + head_dim/2: RoFormer rotates interleaved pairs, ours the two halves); every "
                     "attention score is unchanged. encoder.embed_positions holds our sin / cos table")
        if model.config.type_vocab_size == 0:
            notes.append("type_vocab_size=0: one all-zero token-type row is written (RoFormer's default token_type_ids 0)")
    if family == "gpt_neox":
        c = model.config
        notes.append("the fused query_key_value holds per head [q_h; k_h; v_h] (ours: [q; k; v] over all heads); "
                     f"RoPE on {c.rope_dims} of {c.d_model // c.n_heads} channels per head (rotary_pct "
                     f"{_rotary_pct(c):g}), rotate-half pairs as ours, base {c.rope_base:g}; "
                     f"{'parallel' if c.parallel_residual else 'sequential'} residual")
    if family in ZERO_BIASES and not model.config.bias:
        notes.append(f"bias=False: the biases {hf_cfg['architectures'][0]} always has are written as zeros")
    if dropped:
        notes.append(f"{hf_cfg['architectures'][0]} has no place for our {', '.join(dropped)}: dropped "
                     f"(the masked-LM function is unchanged)")
        warnings.warn(f"export_hf({src}): {notes[-1]}", stacklevel=2)
    if family == "albert":
        notes.append("one ALBERT layer (num_hidden_groups = inner_group_num = 1) holds block 0's tensors, which every "
                     "depth shares (share_layers='all')")
        if model.config.embedding_size is None:
            notes.append("embedding_size = hidden_size: encoder.embedding_hidden_mapping_in is written as the identity "
                         "with a zero bias (ALBERT always projects)")
        notes.append("the NSP head is written as ALBERT's sentence-order head sop_classifier.classifier.* (index 0 = "
                     "original order)" if model.config.use_nsp else
                     "the pooler is written as albert.pooler.*: AlbertForMaskedLM does not use it; AlbertModel reads it")
    if hf_cfg["architectures"][0] == "BertForPreTraining":
        notes.append("the NSP head is written as cls.seq_relationship.* (BertForPreTraining); AutoModelForMaskedLM "
                     "loads the same folder without it and the pooler")
    elif family in ("bert", "roberta"):
        notes.append(f"the pooler is written as {family}.pooler.*: {hf_cfg['architectures'][0]} does not use it "
                     f"(transformers lists it as unused); {'BertModel' if family == 'bert' else 'RobertaModel'} reads it")
    files = tokenizer_files(tokenizer, config.max_positions) if tokenizer is not None else {}
    if tokenizer is None:
        notes.append(f"the checkpoint has no {TOKENIZER_DIR}/: no tokenizer files were written")
    elif tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{src}: the tokenizer can emit {tokenizer.vocab_size} ids, the model embeds "
                         f"vocab_size={config.vocab_size}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_folder(out)
    tmp.mkdir()
    try:
        (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        save_safetensors(state, tmp / "model.safetensors", metadata={"format": "pt"})
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / "README.md").write_text(_readme(src, family, hf_cfg, notes), encoding="utf-8")
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
