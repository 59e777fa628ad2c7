"""Named model shapes for pretraining: tiny (tests), mini (the CPU default), small, base (GPUs).

Each preset gives the fields of `EncoderConfig` / `DecoderConfig` (docs/design.md) except
`vocab_size`, which comes from the tokenizer at training time. The encoder presets are faithful to
BERT (Devlin et al., 2019): post-LN, learned absolute positions, GELU, dropout 0.1, LayerNorm eps
1e-12, two segment types, tied MLM head. The decoder presets are faithful to GPT-2 (Radford et al.,
2019): pre-LN, learned positions, tanh-GELU, dropout 0.1, eps 1e-5, tied LM head.

| preset | layers | width | heads | FFN  | use |
|--------|--------|-------|-------|------|-----|
| tiny   | 2      | 64    | 2     | 256  | tests, seconds |
| mini   | 4      | 256   | 4     | 1024 | CPU default |
| small  | 6      | 512   | 8     | 2048 | big CPU / small GPU |
| base   | 12     | 768   | 12    | 3072 | BERT-base / GPT-2 small shape, GPUs |

The "bilm" kind (ELMo, plmodels/elmo.py) has its own shapes, `BILM_SHAPES`: 2 biLSTM layers whose
[forward; backward] width matches the table's width. Its transformer control, "tbilm", is the
table's shape split in two causal decoders of GPT-2's style (half the width, heads and FFN each).

The "seq2seq" kind (T5 / BART, plmodels/seq2seq.py) has `SEQ2SEQ_SHAPES`: half the table's blocks
in the encoder and half in the decoder (at least 2 each: tiny is 2 + 2), at the table's width,
heads and FFN. Mini, 2 + 2 blocks x 256, has about bert-mini's parameters at a 16k vocabulary: T5
7.79M with its 100 sentinels, BART 8.05M with its two position tables, bert-mini 7.54M (a decoder
block is a third larger than an encoder block for its cross-attention). Its style is
`Seq2SeqConfig`'s defaults, T5's; a recipe asks for BART's options in its `model` block
(plmodels/recipes/pretrain/bart-*.json).

The "xlnet" kind (plmodels/xlnet.py) has `XLNET_SHAPES`: the table's shapes in XLNet's style
(`XLNET_STYLE`, the authors' and HF's defaults: post-LN, GELU, dropout 0.1, eps 1e-12, relative
positions, no bi_data, no clamp). Mini has 7,534,464 parameters at a 16k vocabulary, bert-mini
7,535,232: each block's extra W_r (the projection of the relative encoding), its three biases and
segment table, and the query stream's mask_emb almost exactly balance BERT's position and type
tables, its embedding LayerNorm and its MLM transform.
"""
from __future__ import annotations

SHAPES: dict[str, dict] = {
    "tiny": {"n_layers": 2, "d_model": 64, "n_heads": 2, "d_ff": 256, "max_positions": 128},
    "mini": {"n_layers": 4, "d_model": 256, "n_heads": 4, "d_ff": 1024, "max_positions": 512},
    "small": {"n_layers": 6, "d_model": 512, "n_heads": 8, "d_ff": 2048, "max_positions": 512},
    "base": {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072, "max_positions": 512},
}

ENCODER_STYLE: dict = {  # BERT
    "position": "learned", "norm": "post", "activation": "gelu", "mlp": "plain", "bias": True,
    "dropout": 0.1, "layer_norm_eps": 1e-12, "tie_embeddings": True,
    "type_vocab_size": 2, "use_nsp": False, "pad_token_id": 0,
}

DECODER_STYLE: dict = {  # GPT-2
    "position": "learned", "norm": "pre", "activation": "gelu_tanh", "mlp": "plain", "bias": True,
    "dropout": 0.1, "layer_norm_eps": 1e-5, "tie_embeddings": True,
}

# ELMo's biLM (plmodels/elmo.py, `ElmoConfig` fields): the paper's 2 layers of LSTMs with projections,
# scaled down so that a layer's [forward; backward] width 2 d_proj is the transformer preset's d_model;
# d_hidden is 4 d_proj (ELMo: 4096 cells, 512 projection, 8x) to keep the CPU step affordable.
BILM_SHAPES: dict[str, dict] = {
    "tiny": {"n_layers": 2, "d_embed": 32, "d_hidden": 128, "d_proj": 32, "dropout": 0.1},
    "mini": {"n_layers": 2, "d_embed": 128, "d_hidden": 512, "d_proj": 128, "dropout": 0.1},
    "small": {"n_layers": 2, "d_embed": 256, "d_hidden": 1024, "d_proj": 256, "dropout": 0.1},
    "base": {"n_layers": 2, "d_embed": 384, "d_hidden": 3072, "d_proj": 384, "dropout": 0.1},
}


# T5 / BART (plmodels/seq2seq.py): the table's blocks split between encoder and decoder
SEQ2SEQ_SHAPES: dict[str, dict] = {
    name: {"n_layers": max(2, s["n_layers"] // 2), "n_decoder_layers": max(2, s["n_layers"] // 2), "d_model": s["d_model"],
           "n_heads": s["n_heads"], "d_ff": s["d_ff"], "max_positions": s["max_positions"], "dropout": 0.1}
    for name, s in SHAPES.items()
}


XLNET_STYLE: dict = {  # XLNet (Yang et al. 2019; zihangdai/xlnet and HF's XLNetConfig defaults)
    "activation": "gelu", "dropout": 0.1, "layer_norm_eps": 1e-12, "attn_type": "bi", "bi_data": False,
    "clamp_len": -1,
}

# XLNet (plmodels/xlnet.py): the table's shapes, in XLNet's style
XLNET_SHAPES: dict[str, dict] = {name: {**XLNET_STYLE, **s} for name, s in SHAPES.items()}


def _shape(name: str) -> dict:
    if name not in SHAPES:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(SHAPES)}")
    return SHAPES[name]


# One function per family, named in its record (plmodels/families.py: `Family.preset`); each gives
# the model-config fields (no vocab_size) of a preset name.
def encoder_preset(name: str) -> dict:
    return {**ENCODER_STYLE, **_shape(name)}


def decoder_preset(name: str) -> dict:
    return {**DECODER_STYLE, **_shape(name)}


def bilm_preset(name: str) -> dict:
    _shape(name)
    return dict(BILM_SHAPES[name])


def tbilm_preset(name: str) -> dict:
    """d_model and n_heads count both directions; each direction's FFN is 4x its width."""
    style = {k: v for k, v in DECODER_STYLE.items() if k != "tie_embeddings"}
    return {**style, **_shape(name), "d_ff": SHAPES[name]["d_ff"] // 2}


def seq2seq_preset(name: str) -> dict:
    _shape(name)
    return dict(SEQ2SEQ_SHAPES[name])


def xlnet_preset(name: str) -> dict:
    _shape(name)
    return dict(XLNET_SHAPES[name])
