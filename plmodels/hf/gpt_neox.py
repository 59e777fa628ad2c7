"""Import a Hugging Face GPT-NeoX folder (Pythia, Biderman et al. 2023) into a workbench Decoder.

GPT-NeoX (Black et al. 2022, "GPT-NeoX-20B: An Open-Source Autoregressive Language Model") is a
pre-LN decoder with three differences from GPT-2, each an option of our Decoder (decoder.py):
- rotary positions (RoPE) on the first `rotary_pct` of each head's channels (Pythia: 25%), base
  `rotary_emb_base`: `position="rope"`, `rotary_dims = int(head_dim * rotary_pct)`, `rope_base`;
- a parallel residual (`use_parallel_residual`, Pythia's default): x + Attn(LN1(x)) + MLP(LN2(x)),
  our `parallel_residual`; false gives GPT-2's sequential block;
- an untied LM head (`embed_out`, `lm_head` in transformers 5), the default `tie_word_embeddings`
  false: our `lm_head.weight` (tied when the config ties and the head is absent or equal to embed_in).

The fused `query_key_value` holds per head [q_h; k_h; v_h] (rows H x 3 x Dh); ours holds [q; k; v]
over all heads (3 x H x Dh): its rows are regrouped (`neox_qkv_to_ours`), weight and bias alike.
`plmodels.hf.export` writes this layout; an export imports back to the same state dict.

The same contract as the other importers (gpt2.py): `config.json` is mapped field by field and
anything our Decoder cannot compute exactly is a ValueError naming the field (attention_bias false,
another rope_type, an activation we lack, an odd number of rotated channels); weights come through
`common.read_hf_weights` (safetensors, sharded or not, or tensors-only pickles); a tensor whose
shape does not fit the config is refused naming it and both shapes; a missing one is refused by
name; old checkpoints' buffers (`attention.bias`, `attention.masked_bias` causal masks,
`attention.rotary_emb.inv_freq`) are ignored, but an inv_freq that disagrees with rotary_pct /
rotary_emb_base is refused (the config would not describe the model that was trained); anything
else unknown is listed in the import report and warned about, never dropped silently. The tokenizer
(Pythia's byte-level BPE tokenizer.json) is read with `Tokenizer.from_hf_folder`. Nothing here
imports `transformers`.

Final-norm convention as for GPT-2 (gpt2.py): our hidden_states[L] is the last block's output
before `final_norm`; transformers' GPT-NeoX returns it after `final_layer_norm`. last_hidden_state
and the logits are the same.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import save
from ..decoder import Decoder, DecoderConfig
from .gpt2 import load_decoder
from .common import HF_ACTIVATIONS, read_hf_weights, weights_source
from ..tokenizer import Tokenizer

__all__ = ["config_from_neox", "import_hf_gpt_neox", "map_neox_state", "neox_name", "neox_qkv_to_ours"]

PREFIX = "gpt_neox."
# GPT-NeoX name (after "gpt_neox.") -> ours; {l} is a layer index. The LM head sits outside the prefix.
NEOX_RENAMES = {
    "embed_in.weight": "wte.weight",
    "layers.{l}.input_layernorm.weight": "blocks.{l}.norm1.weight",
    "layers.{l}.input_layernorm.bias": "blocks.{l}.norm1.bias",
    "layers.{l}.attention.query_key_value.weight": "blocks.{l}.attn.qkv.weight",  # rows per head [q_h; k_h; v_h]
    "layers.{l}.attention.query_key_value.bias": "blocks.{l}.attn.qkv.bias",
    "layers.{l}.attention.dense.weight": "blocks.{l}.attn.out.weight",
    "layers.{l}.attention.dense.bias": "blocks.{l}.attn.out.bias",
    "layers.{l}.post_attention_layernorm.weight": "blocks.{l}.norm2.weight",
    "layers.{l}.post_attention_layernorm.bias": "blocks.{l}.norm2.bias",
    "layers.{l}.mlp.dense_h_to_4h.weight": "blocks.{l}.mlp.fc_in.weight",
    "layers.{l}.mlp.dense_h_to_4h.bias": "blocks.{l}.mlp.fc_in.bias",
    "layers.{l}.mlp.dense_4h_to_h.weight": "blocks.{l}.mlp.fc_out.weight",
    "layers.{l}.mlp.dense_4h_to_h.bias": "blocks.{l}.mlp.fc_out.bias",
    "final_layer_norm.weight": "final_norm.weight",
    "final_layer_norm.bias": "final_norm.bias",
}
LM_HEADS = ("embed_out.weight", "lm_head.weight")  # the original name, and transformers 5's
BUFFERS = re.compile(r"^(layers\.\d+\.attention\.(bias|masked_bias)|(layers\.\d+\.attention\.)?rotary_emb\.inv_freq)$")
INV_FREQ_TOL = 1e-6  # relative: the checkpoint's float32 inv_freq against ours, computed in float64
# config fields whose other values change what GPT-NeoX computes in ways our Decoder does not
NEOX_REQUIRED = {"attention_bias": True, "is_decoder": False, "add_cross_attention": False}


def _int(hf: dict, key: str, where: str) -> int:
    value = hf.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{where}: {key}={value!r} must be a positive integer" if key in hf
                         else f"{where}: field {key!r} is missing")
    return value


def _rope(hf: dict, where: str) -> tuple[float, float]:
    """(rotary fraction, base) from rotary_pct / rotary_emb_base (transformers < 5, Pythia's files) or
    rope_parameters / rope_scaling (transformers 5), with transformers' defaults 0.25 and 10000."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{where}: rope_parameters={params!r} must be an object")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(f"{where}: rope_type={kind!r} is not supported (only 'default': no RoPE scaling)")
    pct = params.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))
    base = params.get("rope_theta", hf.get("rotary_emb_base", 10000))
    for key, value in (("rotary_pct", pct), ("rotary_emb_base", base)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{where}: {key}={value!r} must be a positive number")
    if pct > 1:
        raise ValueError(f"{where}: rotary_pct={pct!r} must be at most 1 (the fraction of each head that is rotated)")
    return float(pct), float(base)


def config_from_neox(hf: dict, where: str = "config.json") -> DecoderConfig:
    """DecoderConfig from a HF GPTNeoXConfig dict; a ValueError naming the field for what we cannot represent.

    Carried: vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
    max_position_embeddings, hidden_act, layer_norm_eps, use_parallel_residual (default true),
    rotary_pct (default 0.25) and rotary_emb_base (default 10000), tie_word_embeddings (default
    false), hidden_dropout (our one dropout rate; attention_dropout only matters in training)."""
    if hf.get("model_type", "gpt_neox") != "gpt_neox":
        raise ValueError(f"{where}: model_type={hf.get('model_type')!r}, only 'gpt_neox' is supported")
    for key, want in NEOX_REQUIRED.items():
        if key in hf and hf[key] is not None and hf[key] != want:
            raise ValueError(f"{where}: {key}={hf[key]!r} is not supported (our Decoder computes {key}={want!r})")
    act = hf.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"{where}: hidden_act={act!r} is not supported; known: {sorted(HF_ACTIVATIONS)}")
    d, n_heads = _int(hf, "hidden_size", where), _int(hf, "num_attention_heads", where)
    if d % n_heads:
        raise ValueError(f"{where}: hidden_size={d} is not a multiple of num_attention_heads={n_heads}")
    head_dim = d // n_heads
    if hf.get("head_dim") not in (None, head_dim):
        raise ValueError(f"{where}: head_dim={hf['head_dim']!r} differs from hidden_size / num_attention_heads = {head_dim}")
    pct, base = _rope(hf, where)
    rotary = int(head_dim * pct)  # transformers' GPTNeoXAttention.rotary_ndims
    if rotary < 2 or rotary % 2:
        raise ValueError(f"{where}: rotary_pct={pct!r} rotates int({head_dim} x {pct}) = {rotary} channels per head; "
                         "RoPE turns pairs of channels, so it must be an even number >= 2")
    eps = hf.get("layer_norm_eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"{where}: layer_norm_eps={eps!r} must be a positive number")
    parallel = hf.get("use_parallel_residual", True)
    if not isinstance(parallel, bool):
        raise ValueError(f"{where}: use_parallel_residual={parallel!r} must be true or false")
    return DecoderConfig(
        vocab_size=_int(hf, "vocab_size", where), d_model=d, n_layers=_int(hf, "num_hidden_layers", where),
        n_heads=n_heads, d_ff=_int(hf, "intermediate_size", where),
        max_positions=_int(hf, "max_position_embeddings", where), position="rope", norm="pre",
        activation=HF_ACTIVATIONS[act], mlp="plain", bias=True, dropout=float(hf.get("hidden_dropout", 0.0)),
        layer_norm_eps=float(eps), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        parallel_residual=parallel, rotary_dims=None if rotary == head_dim else rotary, rope_base=base,
    )


def neox_qkv_to_ours(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """query_key_value weight (3D, D) or bias (3D,), rows per head [q_h; k_h; v_h] -> ours, rows [q; k; v]."""
    return t.reshape(n_heads, 3, t.shape[0] // (3 * n_heads), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _map(hf_state: dict[str, torch.Tensor], n_heads: int):
    """(state, {our name: HF name}, unknown, ignored buffers)."""
    exact = {src: dst for src, dst in NEOX_RENAMES.items() if "{l}" not in src}
    templated = [(re.compile("^" + re.escape(src).replace(r"\{l\}", r"(\d+)") + "$"), dst)
                 for src, dst in NEOX_RENAMES.items() if "{l}" in src]
    state, sources, unknown, ignored = {}, {}, [], []
    for name, tensor in hf_state.items():
        key = name.removeprefix(PREFIX)
        if key in LM_HEADS:
            dst = "lm_head.weight"
        elif BUFFERS.match(key):
            ignored.append(name)
            continue
        else:
            dst = exact.get(key)
            for pattern, template in templated if dst is None else ():
                if m := pattern.match(key):
                    dst = template.format(l=m[1])
                    break
        if dst is None:
            unknown.append(name)
            continue
        if dst in state:
            raise ValueError(f"GPT-NeoX state has {sources[dst]!r} and {name!r} for the same weight (our {dst})")
        if dst.endswith("attn.qkv.weight") or dst.endswith("attn.qkv.bias"):
            if tensor.shape[0] % (3 * n_heads):
                raise ValueError(f"{name} has {tensor.shape[0]} rows, not 3 x num_attention_heads x head size")
            tensor = neox_qkv_to_ours(tensor, n_heads)
        state[dst], sources[dst] = tensor, name
    return state, sources, unknown, ignored


def neox_name(ours: str) -> str:
    """The GPT-NeoX name (with its "gpt_neox." prefix) of our tensor `ours`, else `ours` itself."""
    if ours == "lm_head.weight":
        return " or ".join(LM_HEADS)
    for src, dst in NEOX_RENAMES.items():
        if m := re.match("^" + re.escape(dst).replace(r"\{l\}", r"(\d+)") + "$", ours):
            return PREFIX + (src.format(l=m[1]) if "{l}" in src else src)
    return ours


def map_neox_state(hf_state: dict[str, torch.Tensor], n_heads: int) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """HF GPT-NeoX names ("gpt_neox." prefix optional; `embed_out` or `lm_head`) -> ours, the fused
    QKV regrouped. Returns (state, unknown HF names, ignored buffers)."""
    state, _, unknown, ignored = _map(hf_state, n_heads)
    return state, unknown, ignored


def _check_inv_freq(hf_state: dict[str, torch.Tensor], names: list[str], config: DecoderConfig, where: str) -> str | None:
    """A stored rotary_emb.inv_freq must be the one config.json implies; returns a note, or None."""
    stored = [n for n in names if n.endswith("rotary_emb.inv_freq")]
    if not stored:
        return None
    R = config.rope_dims
    want = 1.0 / config.rope_base ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    for name in stored:
        got = hf_state[name].double().flatten()
        if got.shape != want.shape or not torch.allclose(got, want, rtol=INV_FREQ_TOL, atol=0):
            raise ValueError(f"{where}: {name} ({tuple(got.shape)} values) is not 1 / base^(2i/R) of rotary_emb_base="
                             f"{config.rope_base} and rotary_pct -> R={R} rotated channels ({R // 2} values): "
                             "config.json does not describe the positions this checkpoint was trained with")
    return f"{len(stored)} stored rotary_emb.inv_freq buffers agree with rotary_pct and rotary_emb_base (ignored)"


def _lm_head(state: dict[str, torch.Tensor], sources: dict[str, str], ignored: list[str], config: DecoderConfig,
             notes: list[str], where: str) -> tuple[DecoderConfig, str]:
    """(config, how the LM head was read). A tying config with a head equal to embed_in: tied (the head
    is ignored); with a different head: kept untied, as transformers does, and noted; an untying config
    needs its head. `state`, `sources`, `ignored` and `notes` are updated in place."""
    head, wte = state.get("lm_head.weight"), state.get("wte.weight")
    if head is not None and config.tie_embeddings:
        if wte is not None and head.shape == wte.shape and torch.equal(head, wte):
            ignored.append(sources.pop("lm_head.weight"))  # tied: the same matrix as embed_in
            del state["lm_head.weight"]
        else:
            notes.append("config.json ties the LM head to embed_in (tie_word_embeddings), but the checkpoint's "
                         f"{sources['lm_head.weight']} is a different matrix: it is kept untied")
            config = DecoderConfig.from_dict({**config.to_dict(), "tie_embeddings": False})
    if "lm_head.weight" in state:
        return config, f"untied (the checkpoint's own {sources['lm_head.weight']})"
    if config.tie_embeddings:
        return config, "tied to embed_in"
    raise ValueError(f"{where}: config.json has tie_word_embeddings=false but the checkpoint has no LM head "
                     f"({' or '.join(LM_HEADS)}); a GPTNeoXModel without its head cannot give next-token logits")


def import_hf_gpt_neox(src_dir: str | Path, out_dir: str | Path | None = None,
                       card: dict | None = None) -> tuple[Decoder, Tokenizer | None]:
    """Read a HF GPT-NeoX folder (GPTNeoXForCausalLM, GPTNeoXModel) -> (Decoder in eval mode, Tokenizer
    or None); save a checkpoint if out_dir. The import report (card "import": weights file(s), unknown
    and ignored tensors, the LM head, rotary and residual layout, notes) is also a warning when
    something is off."""
    src = Path(src_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json (not a Hugging Face model folder)")
    where = str(src / "config.json")
    hf_cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config = config_from_neox(hf_cfg, where)
    hf_state = read_hf_weights(src)
    state, sources, unknown, ignored = _map(hf_state, config.n_heads)
    notes: list[str] = []
    if note := _check_inv_freq(hf_state, ignored, config, str(src)):
        notes.append(note)
    config, lm_head = _lm_head(state, sources, ignored, config, notes, str(src))
    drops = {k: hf_cfg[k] for k in ("attention_dropout",) if k in hf_cfg and hf_cfg[k] != config.dropout}
    if drops:
        notes.append(f"one dropout rate: hidden_dropout={config.dropout} is used; {drops} differs (training only)")
    model, tokenizer = load_decoder(config, state, {k: (v, False) for k, v in sources.items()}, src, neox_name, notes)
    head_dim = config.d_model // config.n_heads
    report: dict[str, Any] = {
        "source": str(src),
        "family": "gpt_neox",
        "weights": weights_source(src),
        "unknown_tensors": unknown,
        "ignored_tensors": ignored,
        "fresh_init": [],
        "lm_head": lm_head,
        "rotary": f"RoPE on {config.rope_dims} of {head_dim} channels per head, base {config.rope_base:g}",
        "residual": "parallel (x + attn(ln1(x)) + mlp(ln2(x)))" if config.parallel_residual else "sequential (GPT-2's)",
        "qkv": "query_key_value regrouped from per head [q_h; k_h; v_h] to our [q; k; v]",
        "tokenizer": None if tokenizer is None else "tokenizer.json" if (src / "tokenizer.json").is_file()
        else "vocab.json + merges.txt",
        "final_norm": "hidden_states[L] is before final_norm (GPT-NeoX's is after final_layer_norm); "
                      "last_hidden_state is after",
        "notes": notes,
    }
    if unknown or [n for n in notes if not n.endswith("(ignored)")]:
        warnings.warn(f"import_hf_gpt_neox({src}): unmapped tensors {unknown}" + "".join(f"; {n}" for n in notes),
                      stacklevel=2)
    if out_dir is not None:
        save(model, tokenizer, out_dir, card={"data": hf_cfg.get("_name_or_path") or str(src), **(card or {}),
                                              "import": report})
    return model, tokenizer
