"""Hugging Face XLNet weights -> the workbench's `XLNet` (xlnet.py): config and name map.

On the rules of the other importers (seq2seq.py, gpt2.py): a config field our model cannot
compute exactly is a ValueError naming it; every tensor of the state dict is mapped, or a known copy
of a mapped one (the tied `lm_loss.weight`), or the conversion fails naming it. Nothing here imports
`transformers`; the parity test does (tests/plmodels/test_xlnet.py).

Layout (HF name -> ours; XLNetLMHeadModel's "transformer." prefix is optional, so an XLNetModel's
state dict converts too, with a zero LM bias):
- `word_embedding.weight` -> `word_embedding.weight`, `mask_emb` -> `mask_emb`;
- `layer.{l}.rel_attn.{q,k,v,r}` (D, H, Dh) -> `blocks.{l}.attn.{q,k,v,r}.weight` (H Dh, D), the
  transpose of the flattened tensor (HF computes einsum("ibh,hnd->ibnd", x, W));
  `rel_attn.o` (D, H, Dh) -> `attn.o.weight` (D, H Dh) (einsum("ibnd,hnd->ibh", vec, W_o));
  `rel_attn.{r_w_bias, r_r_bias, r_s_bias, seg_embed}` -> `attn.*`; `rel_attn.layer_norm` -> `norm1`;
- `layer.{l}.ff.layer_1` / `layer_2` / `layer_norm` -> `blocks.{l}.fc_in` / `fc_out` / `norm2`;
- `lm_loss.bias` -> `lm_bias` (`lm_loss.weight` must equal the word embeddings: our head is tied).
"""

from __future__ import annotations

import re

import torch

from .common import import_converted
from ..xlnet import XLNet, XLNetConfig

__all__ = ["from_hf_xlnet_state_dict", "import_hf_xlnet", "xlnet_config"]

ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh"}


def xlnet_config(hf: dict) -> XLNetConfig:
    """XLNetConfig from a HF XLNetConfig dict (`config.to_dict()` or config.json)."""
    for key in ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"):
        if hf.get(key) is None:
            raise ValueError(f"config field {key!r} is missing")
    d, H = hf["d_model"], hf["n_head"]
    if hf.get("d_head", d // H) * H != d:
        raise ValueError(f"d_head={hf.get('d_head')} x n_head={H} != d_model={d}: our attention needs H Dh = D")
    act = ACTIVATIONS.get(hf.get("ff_activation", "gelu"))
    if act is None:
        raise ValueError(f"ff_activation={hf.get('ff_activation')!r} is not supported; known: {sorted(ACTIVATIONS)}")
    if hf.get("attn_type", "bi") == "uni" and hf.get("same_length"):
        raise ValueError("same_length=True with attn_type='uni' is not supported")
    if hf.get("tie_word_embeddings") is False:
        raise ValueError("tie_word_embeddings=False: our LM head is tied to the word embeddings")
    return XLNetConfig(
        vocab_size=hf["vocab_size"], d_model=d, n_layers=hf["n_layer"], n_heads=H, d_ff=hf["d_inner"],
        dropout=float(hf.get("dropout", 0.1)), layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        activation=act, bi_data=bool(hf.get("bi_data", False)), clamp_len=int(hf.get("clamp_len", -1)),
        attn_type=hf.get("attn_type", "bi"),
    )


# (HF name pattern without the "transformer." prefix, our name); {l} a layer, {p} a projection, {wb} weight|bias
RENAMES = [
    (r"word_embedding\.weight", "word_embedding.weight"),
    (r"mask_emb", "mask_emb"),
    (r"layer\.(?P<l>\d+)\.rel_attn\.(?P<p>q|k|v|r|o)", "blocks.{l}.attn.{p}.weight"),
    (r"layer\.(?P<l>\d+)\.rel_attn\.(?P<p>r_w_bias|r_r_bias|r_s_bias|seg_embed)", "blocks.{l}.attn.{p}"),
    (r"layer\.(?P<l>\d+)\.rel_attn\.layer_norm\.(?P<wb>weight|bias)", "blocks.{l}.norm1.{wb}"),
    (r"layer\.(?P<l>\d+)\.ff\.layer_1\.(?P<wb>weight|bias)", "blocks.{l}.fc_in.{wb}"),
    (r"layer\.(?P<l>\d+)\.ff\.layer_2\.(?P<wb>weight|bias)", "blocks.{l}.fc_out.{wb}"),
    (r"layer\.(?P<l>\d+)\.ff\.layer_norm\.(?P<wb>weight|bias)", "blocks.{l}.norm2.{wb}"),
    (r"lm_loss\.bias", "lm_bias"),
]
_TABLE = [(re.compile("^(?:transformer\\.)?" + pattern + "$"), template) for pattern, template in RENAMES]


def _reshape(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """HF's (D, H, Dh) projection tensors -> nn.Linear weights."""
    D = tensor.shape[0]
    if name.endswith(".o.weight"):
        return tensor.reshape(D, -1)  # (D, H Dh): out_h = sum_{n,d} vec_{n,d} W_o[h, n, d]
    if name.endswith((".q.weight", ".k.weight", ".v.weight", ".r.weight")):
        return tensor.reshape(D, -1).t().contiguous()  # (H Dh, D)
    return tensor


def from_hf_xlnet_state_dict(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An XLNetLMHeadModel (or XLNetModel) state dict -> our XLNet state dict."""
    state, unknown = {}, []
    embed = hf_state.get("transformer.word_embedding.weight", hf_state.get("word_embedding.weight"))
    for name, tensor in hf_state.items():
        if name == "lm_loss.weight":
            if embed is None or not torch.equal(tensor, embed):
                raise ValueError("lm_loss.weight differs from the word embeddings, but our model ties them")
            continue
        for regex, template in _TABLE:
            if m := regex.match(name):
                ours = template.format(**m.groupdict())
                state[ours] = _reshape(ours, tensor)
                break
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"tensors with no place in XLNet: {unknown}")
    if "lm_bias" not in state and "word_embedding.weight" in state:  # XLNetModel: no LM head
        state["lm_bias"] = torch.zeros(state["word_embedding.weight"].shape[0])
    return state


def import_hf_xlnet(src_dir, out_dir=None, card: dict | None = None):
    """Read a HF XLNet folder (XLNetLMHeadModel or XLNetModel) -> (XLNet in eval mode, Tokenizer or
    None); save a checkpoint if out_dir (`common.import_converted`)."""

    def build(hf: dict, state: dict):
        return XLNet(xlnet_config(hf)), from_hf_xlnet_state_dict(state)

    return import_converted(src_dir, out_dir, card, "xlnet", build)
