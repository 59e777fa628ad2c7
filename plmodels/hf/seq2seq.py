"""Hugging Face T5 and BART weights -> the workbench's `Seq2Seq` (seq2seq.py): configs and name maps.

On the rules of the other importers (gpt2.py, encoders.py): a config field our model cannot
compute exactly is a ValueError naming it; every tensor of the state dict is either mapped, or a
known copy of a mapped one (tied embeddings), or the conversion fails naming it -- nothing is
dropped silently. Nothing here imports `transformers`; the parity tests do
(tests/plmodels/test_seq2seq_parity.py).

Layout (HF name -> ours; {s} = encoder / decoder, {l} a layer):
- T5 (T5ForConditionalGeneration): `shared.weight` -> `shared.weight` (`{s}.embed_tokens.weight`
  and a tied `lm_head.weight` are the same tensor); `{s}.block.{l}.layer.0.SelfAttention.{q,k,v,o}`
  -> `{s}.blocks.{l}.{attn|self_attn}.{q_proj, kv_proj = [k; v], out}`; `layer.0.layer_norm` ->
  `norm1`; decoder `layer.1.EncDecAttention.*` -> `cross_attn.*`, `layer.1.layer_norm` ->
  `norm_cross`; the last layer's `DenseReluDense.wi` (or `[wi_0; wi_1]`, gated) / `wo` ->
  `mlp.fc_in` / `mlp.fc_out`, its `layer_norm` -> `norm2`; `{s}.block.0.layer.0.SelfAttention.
  relative_attention_bias` -> `{s}.relative_bias.table`; `{s}.final_layer_norm` -> `{s}.final_norm`.
- BART (BartForConditionalGeneration, "model." prefix): `shared` -> `shared`; `{s}.embed_positions`
  -> `{s}.positions` (offset 2 kept: same rows); `{s}.layernorm_embedding` -> `{s}.embed_norm`;
  `{s}.layers.{l}.self_attn.{q,k,v,out}_proj` -> `{attn|self_attn}.{q_proj, kv_proj, out}`,
  `self_attn_layer_norm` -> `norm1`, `encoder_attn.*` -> `cross_attn.*`, `encoder_attn_layer_norm`
  -> `norm_cross`, `fc1` / `fc2` -> `mlp.fc_in` / `mlp.fc_out`, `final_layer_norm` -> `norm2`;
  `final_logits_bias` (1, V) -> (V,).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from .common import import_converted
from ..seq2seq import Seq2Seq, Seq2SeqConfig

__all__ = ["bart_config", "from_hf_bart_state_dict", "from_hf_t5_state_dict", "import_hf_bart", "import_hf_t5",
           "t5_config"]


def _get(hf: dict, key: str, default=None):
    value = hf.get(key, default)
    if value is None:
        raise ValueError(f"config field {key!r} is missing")
    return value


def t5_config(hf: dict) -> Seq2SeqConfig:
    """Seq2SeqConfig from a HF T5Config dict (`config.to_dict()` or config.json)."""
    d, H, d_kv = _get(hf, "d_model"), _get(hf, "num_heads"), _get(hf, "d_kv")
    if H * d_kv != d:
        raise ValueError(f"d_kv={d_kv} x num_heads={H} != d_model={d}: our attention needs inner dim = d_model")
    proj = hf.get("feed_forward_proj", "relu")
    acts = {"relu": ("relu", "plain"), "gated-gelu": ("gelu_tanh", "gated"), "gated-relu": ("relu", "gated")}
    if proj not in acts:
        raise ValueError(f"feed_forward_proj={proj!r} is not supported; known: {sorted(acts)}")
    activation, mlp = acts[proj]
    return Seq2SeqConfig.t5(
        vocab_size=_get(hf, "vocab_size"), d_model=d, n_layers=_get(hf, "num_layers"),
        n_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], n_heads=H, d_ff=_get(hf, "d_ff"),
        max_positions=int(hf.get("n_positions") or 512), relative_buckets=_get(hf, "relative_attention_num_buckets"),
        relative_max_distance=hf.get("relative_attention_max_distance", 128), activation=activation, mlp=mlp,
        dropout=float(hf.get("dropout_rate", 0.1)), layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), rescale_tied_output=_t5_rescale(hf),
        pad_token_id=int(hf.get("pad_token_id", 0)), decoder_start_token_id=int(hf.get("decoder_start_token_id", 0)),
    )


def _t5_rescale(hf: dict) -> bool:
    """Whether T5 multiplies the decoder output by d_model^-0.5. transformers 4 did so exactly when the
    LM head was tied; transformers 5 always ties it and reads the old `tie_word_embeddings` into
    `scale_decoder_outputs` (so a T5 with tie_word_embeddings=false there is tied and unscaled)."""
    if hf.get("scale_decoder_outputs") is not None:
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


def bart_config(hf: dict) -> Seq2SeqConfig:
    """Seq2SeqConfig from a HF BartConfig dict."""
    d = _get(hf, "d_model")
    if hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads"):
        raise ValueError("encoder_attention_heads != decoder_attention_heads: our model has one n_heads")
    if hf.get("encoder_ffn_dim") != hf.get("decoder_ffn_dim"):
        raise ValueError("encoder_ffn_dim != decoder_ffn_dim: our model has one d_ff")
    act = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}.get(hf.get("activation_function", "gelu"))
    if act is None:
        raise ValueError(f"activation_function={hf.get('activation_function')!r} is not supported")
    if hf.get("normalize_before") or hf.get("add_final_layer_norm"):
        raise ValueError("normalize_before / add_final_layer_norm (mBART) are not supported")
    return Seq2SeqConfig.bart(
        vocab_size=_get(hf, "vocab_size"), d_model=d, n_layers=_get(hf, "encoder_layers"),
        n_decoder_layers=_get(hf, "decoder_layers"), n_heads=_get(hf, "encoder_attention_heads"),
        d_ff=_get(hf, "encoder_ffn_dim"), max_positions=_get(hf, "max_position_embeddings"), activation=act,
        dropout=float(hf.get("dropout", 0.1)), scale_embedding=bool(hf.get("scale_embedding", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)), pad_token_id=int(hf.get("pad_token_id", 1)),
        decoder_start_token_id=int(hf.get("decoder_start_token_id", 2)),
    )


# (HF name pattern, our name template). In a pattern {s} matches encoder|decoder, {l} a layer,
# {proj} a projection (renamed by PROJ) and {wb} weight|bias; in a template {attn} is the stack's
# self-attention name (ATTN).
ATTN = {"encoder": "attn", "decoder": "self_attn"}
T5_RENAMES = [
    ("shared.weight", "shared.weight"),
    ("{s}.final_layer_norm.weight", "{s}.final_norm.weight"),
    ("{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "{s}.relative_bias.table.weight"),
    ("{s}.block.{l}.layer.0.SelfAttention.{proj}.weight", "{s}.blocks.{l}.{attn}.{proj}.weight"),
    ("{s}.block.{l}.layer.0.layer_norm.weight", "{s}.blocks.{l}.norm1.weight"),
    ("decoder.block.{l}.layer.1.EncDecAttention.{proj}.weight", "decoder.blocks.{l}.cross_attn.{proj}.weight"),
    ("decoder.block.{l}.layer.1.layer_norm.weight", "decoder.blocks.{l}.norm_cross.weight"),
    ("encoder.block.{l}.layer.1.DenseReluDense.{proj}.weight", "encoder.blocks.{l}.mlp.{proj}.weight"),
    ("encoder.block.{l}.layer.1.layer_norm.weight", "encoder.blocks.{l}.norm2.weight"),
    ("decoder.block.{l}.layer.2.DenseReluDense.{proj}.weight", "decoder.blocks.{l}.mlp.{proj}.weight"),
    ("decoder.block.{l}.layer.2.layer_norm.weight", "decoder.blocks.{l}.norm2.weight"),
    ("lm_head.weight", "lm_head.weight"),
]
BART_RENAMES = [
    ("model.shared.weight", "shared.weight"),
    ("model.{s}.embed_positions.weight", "{s}.positions.weight"),
    ("model.{s}.layernorm_embedding.{wb}", "{s}.embed_norm.{wb}"),
    ("model.{s}.layers.{l}.self_attn.{proj}.{wb}", "{s}.blocks.{l}.{attn}.{proj}.{wb}"),
    ("model.{s}.layers.{l}.self_attn_layer_norm.{wb}", "{s}.blocks.{l}.norm1.{wb}"),
    ("model.decoder.layers.{l}.encoder_attn.{proj}.{wb}", "decoder.blocks.{l}.cross_attn.{proj}.{wb}"),
    ("model.decoder.layers.{l}.encoder_attn_layer_norm.{wb}", "decoder.blocks.{l}.norm_cross.{wb}"),
    ("model.{s}.layers.{l}.{proj}.{wb}", "{s}.blocks.{l}.mlp.{proj}.{wb}"),
    ("model.{s}.layers.{l}.final_layer_norm.{wb}", "{s}.blocks.{l}.norm2.{wb}"),
    ("lm_head.weight", "lm_head.weight"),
    ("final_logits_bias", "final_logits_bias"),
]
# HF projection -> ours; k and v (and a gated MLP's two input halves) are parked under their own
# names and fused by `_fuse`
PROJ = {"q": "q_proj", "k": "k", "v": "v", "o": "out", "q_proj": "q_proj", "k_proj": "k", "v_proj": "v",
        "out_proj": "out", "wi": "fc_in", "wi_0": "gate", "wi_1": "up", "wo": "fc_out", "fc1": "fc_in", "fc2": "fc_out"}
GROUPS = {"{s}": r"(?P<s>encoder|decoder)", "{l}": r"(?P<l>\d+)",
          "{proj}": "(?P<proj>" + "|".join(sorted(PROJ, key=len, reverse=True)) + ")", "{wb}": r"(?P<wb>weight|bias)"}


def _compile(renames: list[tuple[str, str]]) -> list[tuple[re.Pattern, str]]:
    out = []
    for pattern, template in renames:
        regex = re.escape(pattern)
        for key, group in GROUPS.items():
            regex = regex.replace(re.escape(key), group)
        out.append((re.compile("^" + regex + "$"), template))
    return out


def _rename(hf_state: dict[str, torch.Tensor], renames, skip: Callable[[str, torch.Tensor], bool]) -> dict[str, torch.Tensor]:
    """Apply the table; every tensor is mapped or skipped (a known duplicate), else a ValueError."""
    table = _compile(renames)
    state, unknown = {}, []
    for name, tensor in hf_state.items():
        if skip(name, tensor):
            continue
        for regex, template in table:
            if m := regex.match(name):
                g = m.groupdict()
                state[template.format(s=g.get("s"), l=g.get("l"), attn=ATTN.get(g.get("s") or "", ""),
                                      proj=PROJ.get(g.get("proj") or "", ""), wb=g.get("wb"))] = tensor
                break
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"tensors with no place in Seq2Seq: {unknown}")
    return state


def _fuse(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Separate k and v -> kv_proj = [k; v] (rows); gated MLP gate and up -> fc_in = [W_g; W_u]."""
    out = {}
    for name, tensor in state.items():
        head, _, leaf = name.rpartition(".")  # leaf: weight or bias
        base, _, part = head.rpartition(".")
        if part in ("k", "v"):
            if part == "k":
                out[f"{base}.kv_proj.{leaf}"] = torch.cat([tensor, state[f"{base}.v.{leaf}"]], dim=0)
        elif part in ("gate", "up"):
            if part == "gate":
                out[f"{base}.fc_in.{leaf}"] = torch.cat([tensor, state[f"{base}.up.{leaf}"]], dim=0)
        else:
            out[name] = tensor
    return out


def _tied_copy(shared_name: str, hf_state: dict[str, torch.Tensor], tie: bool) -> Callable[[str, torch.Tensor], bool]:
    """Skip the copies of the shared table: the stacks' embed_tokens, and lm_head when tied."""
    shared = hf_state[shared_name]

    def skip(name: str, tensor: torch.Tensor) -> bool:
        if name.endswith("embed_tokens.weight") or (name == "lm_head.weight" and tie):
            if not torch.equal(tensor, shared):
                raise ValueError(f"{name} differs from {shared_name}, but our model ties them")
            return True
        return False
    return skip


def from_hf_t5_state_dict(hf_state: dict[str, torch.Tensor], config: Seq2SeqConfig) -> dict[str, torch.Tensor]:
    """A T5ForConditionalGeneration state dict -> our Seq2Seq state dict for `config` (`t5_config`)."""
    state = _fuse(_rename(hf_state, T5_RENAMES, _tied_copy("shared.weight", hf_state, config.tie_embeddings)))
    return state


def from_hf_bart_state_dict(hf_state: dict[str, torch.Tensor], config: Seq2SeqConfig) -> dict[str, torch.Tensor]:
    """A BartForConditionalGeneration state dict -> our Seq2Seq state dict for `config` (`bart_config`)."""
    state = _fuse(_rename(hf_state, BART_RENAMES, _tied_copy("model.shared.weight", hf_state, config.tie_embeddings)))
    if "final_logits_bias" in state:
        state["final_logits_bias"] = state["final_logits_bias"].reshape(-1)  # (1, V) -> (V,)
    return state


def import_hf_t5(src_dir, out_dir=None, card: dict | None = None):
    """Read a HF T5 folder (T5ForConditionalGeneration) -> (Seq2Seq in eval mode, Tokenizer or None);
    save a checkpoint if out_dir (`common.import_converted`)."""

    def build(hf: dict, state: dict):
        config = t5_config(hf)
        return Seq2Seq(config), from_hf_t5_state_dict(state, config)

    return import_converted(src_dir, out_dir, card, "t5", build)


def import_hf_bart(src_dir, out_dir=None, card: dict | None = None):
    """Read a HF BART folder (BartForConditionalGeneration) -> (Seq2Seq in eval mode, Tokenizer or
    None); save a checkpoint if out_dir (`common.import_converted`)."""

    def build(hf: dict, state: dict):
        config = bart_config(hf)
        return Seq2Seq(config), from_hf_bart_state_dict(state, config)

    return import_converted(src_dir, out_dir, card, "bart", build)
