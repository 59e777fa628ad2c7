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
| Decoder | `GPT2LMHeadModel` | learned positions, pre-LN, plain MLP, biases, softmax output |

Refused everywhere: pruned heads (transformers 5 has no `pruned_heads`, and BERT / GPT-2 need
n_heads x head_dim = hidden size), RoPE (GPT-NeoX / RoFormer export is not built yet), ALiBi,
gated MLPs, no biases, pre-LN encoders, post-LN decoders, the adaptive softmax, and any config
field this module does not know at a non-default value (a field added later is never dropped
silently).

What each layout holds beyond the MLM / LM function:
- BERT: the pooler is written (`bert.pooler.*`): BertForMaskedLM has none and reports it as
  unused, `BertModel.from_pretrained` reads it. With `use_nsp` the folder is a `BertForPreTraining`
  (architectures), whose `cls.seq_relationship` holds our NSP head; AutoModelForMaskedLM reads it too.
- RoBERTa: the pooler is written (`roberta.pooler.*`), as for BERT.
- DistilBERT has no pooler: ours is dropped, with a warning and a note in the folder's README.md.

Weights (model.safetensors, metadata format=pt) use HF's names: our fused QKV (rows [q; k; v]) is
split into query / key / value (BERT, RoBERTa: `attention.self.*`; DistilBERT: `q_lin/k_lin/v_lin`);
GPT-2's Conv1D weights (c_attn, c_proj, c_fc) are written (in, out), the transpose of ours. A tied
head writes no decoder / lm_head matrix (transformers ties it: tie_word_embeddings=true); an untied
one writes its own. BERT's and RoBERTa's MLM bias is written twice, as the head's bias and as
`decoder.bias` (transformers 5 ties the two only when it ties the weights). The importers (`hf_import.import_hf_bert`, `hf_encoders.import_hf_roberta` /
`import_hf_distilbert`, `hf_gpt2.import_hf_gpt2`) read an export back into the same state dict
(DistilBERT: but the pooler).

Tokenizer files, when the checkpoint has a tokenizer: `tokenizer.json` (ours, padding and
truncation off), `tokenizer_config.json` and `special_tokens_map.json` with the special tokens of
our roles and the class (`BertTokenizerFast` with do_lower_case for WordPiece, plus `vocab.txt`;
`RobertaTokenizerFast` for a BPE with cls and sep roles; else `GPT2TokenizerFast`).
`AutoTokenizer.from_pretrained` then gives our `encode` ids (with and without specials).

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

from .checkpoint import CONFIG_FILE, MODEL_KINDS, TOKENIZER_DIR, load
from .files import replace_folder, save_safetensors, temp_folder
from .hf_gpt2 import GPT2_CONV1D, GPT2_RENAMES
from .hf_import import RENAMES as BERT_RENAMES

__all__ = ["export_hf", "hf_layout", "hf_state", "tokenizer_files"]

# our activation -> the HF name of exactly that function (gelu_pytorch_tanh is F.gelu(approximate="tanh");
# GPT-2 keeps its own name, gelu_new, the same function written out: they differ by < 1e-7)
BERT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
DISTILBERT_EPS = 1e-12  # hard-coded in transformers' DistilBERT

# HF name (after the family prefix) -> ours, {l} a layer index; q/k/v are handled apart (QKV_SPLIT)
ROBERTA_RENAMES = {
    **{k: v for k, v in BERT_RENAMES.items() if k.startswith(("embeddings.", "encoder.", "pooler."))},
    "lm_head.dense.weight": "mlm.dense.weight",
    "lm_head.dense.bias": "mlm.dense.bias",
    "lm_head.layer_norm.weight": "mlm.norm.weight",
    "lm_head.layer_norm.bias": "mlm.norm.bias",
    "lm_head.bias": "mlm.bias",
    "lm_head.decoder.weight": "mlm.decoder.weight",
}
DISTILBERT_RENAMES = {
    "embeddings.word_embeddings.weight": "embeddings.word.weight",
    "embeddings.position_embeddings.weight": "embeddings.position.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.weight",
    "embeddings.LayerNorm.bias": "embeddings.norm.bias",
    "transformer.layer.{l}.attention.out_lin.weight": "blocks.{l}.attn.out.weight",
    "transformer.layer.{l}.attention.out_lin.bias": "blocks.{l}.attn.out.bias",
    "transformer.layer.{l}.sa_layer_norm.weight": "blocks.{l}.norm1.weight",
    "transformer.layer.{l}.sa_layer_norm.bias": "blocks.{l}.norm1.bias",
    "transformer.layer.{l}.ffn.lin1.weight": "blocks.{l}.mlp.fc_in.weight",
    "transformer.layer.{l}.ffn.lin1.bias": "blocks.{l}.mlp.fc_in.bias",
    "transformer.layer.{l}.ffn.lin2.weight": "blocks.{l}.mlp.fc_out.weight",
    "transformer.layer.{l}.ffn.lin2.bias": "blocks.{l}.mlp.fc_out.bias",
    "transformer.layer.{l}.output_layer_norm.weight": "blocks.{l}.norm2.weight",
    "transformer.layer.{l}.output_layer_norm.bias": "blocks.{l}.norm2.bias",
    "vocab_transform.weight": "mlm.dense.weight",
    "vocab_transform.bias": "mlm.dense.bias",
    "vocab_layer_norm.weight": "mlm.norm.weight",
    "vocab_layer_norm.bias": "mlm.norm.bias",
    "vocab_projector.bias": "mlm.bias",
    "vocab_projector.weight": "mlm.decoder.weight",
}
BERT_EXPORT_RENAMES = {**BERT_RENAMES, "cls.predictions.decoder.weight": "mlm.decoder.weight"}
# family -> (renames, prefix of the base model's names, heads outside the prefix, q/k/v names)
FAMILIES: dict[str, tuple[dict[str, str], str, tuple[str, ...], str]] = {
    "bert": (BERT_EXPORT_RENAMES, "bert.", ("cls.",), "encoder.layer.{l}.attention.self.{part}.{kind}"),
    "roberta": (ROBERTA_RENAMES, "roberta.", ("lm_head.",), "encoder.layer.{l}.attention.self.{part}.{kind}"),
    "distilbert": (DISTILBERT_RENAMES, "distilbert.", ("vocab_",), "transformer.layer.{l}.attention.{part}.{kind}"),
    "gpt2": (GPT2_RENAMES, "transformer.", (), ""),
}
QKV_PARTS = {"bert": ("query", "key", "value"), "roberta": ("query", "key", "value"),
             "distilbert": ("q_lin", "k_lin", "v_lin")}
DROPPED = {"distilbert": ("pooler.",)}  # our tensors a layout has no place for (noted, with a warning)

# every config field this module has looked at; another field at a non-default value is refused
ENCODER_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "position", "norm",
                  "activation", "mlp", "bias", "dropout", "layer_norm_eps", "tie_embeddings", "type_vocab_size",
                  "use_nsp", "pad_token_id", "pruned_heads", "position_ids"}
DECODER_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions", "position", "norm",
                  "activation", "mlp", "bias", "dropout", "layer_norm_eps", "tie_embeddings", "output",
                  "adaptive_cutoffs", "adaptive_div", "pruned_heads"}


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


def _check_common(config: Any, kind: str) -> None:
    """The refusals shared by every family (see the module docstring)."""
    pruned = {int(l): list(h) for l, h in (config.pruned_heads or {}).items() if h}
    if pruned:
        counts = {config.n_heads - len(h) for h in pruned.values()}
        if len(pruned) < config.n_layers:
            counts.add(config.n_heads)
        why = ("different head counts per layer" if len(counts) > 1 else "fewer heads than d_model / head_dim")
        raise _refuse("pruned_heads", pruned, f"pruned heads give {why}; transformers 5 has no pruned_heads and its "
                                              "BERT / GPT-2 need n_heads x head_dim = hidden size")
    if config.position == "rope":
        raise _refuse("position", "rope", "RoPE export (GPT-NeoX / RoFormer layout) is not built yet")
    if config.position != "learned":
        raise _refuse("position", config.position, "BERT, RoBERTa, DistilBERT and GPT-2 only have learned absolute "
                                                   "positions")
    if config.mlp != "plain":
        raise _refuse("mlp", config.mlp, "a gated MLP has no place in BERT / GPT-2 (plain MLP only)")
    if not config.bias:
        raise _refuse("bias", config.bias, "BERT / GPT-2 always have biases in linear layers and LayerNorms")
    if config.activation not in BERT_ACTIVATIONS:
        raise _refuse("activation", config.activation, f"no Hugging Face name known; known: {sorted(BERT_ACTIVATIONS)}")
    want = "post" if kind == "encoder" else "pre"
    if config.norm != want:
        what = "BERT-family encoders are post-LN" if kind == "encoder" else "GPT-2 is pre-LN"
        raise _refuse("norm", config.norm, f"{what}; a {config.norm}-LN {kind} has no Hugging Face layout here")


def _encoder_family(config: Any) -> str:
    """"bert" | "roberta" | "distilbert" for an exportable EncoderConfig, else a ValueError naming the field."""
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
    _check_known_fields(config, DECODER_FIELDS)
    if config.output != "softmax":
        raise _refuse("output", config.output, "GPT-2's LM head is a full softmax; the adaptive softmax has no "
                                               "Hugging Face layout")
    _check_common(config, "decoder")
    return "gpt2"


def _token_id(tokenizer: Any, role: str) -> int | None:
    return None if tokenizer is None else getattr(tokenizer, f"{role}_id", None)


def hf_layout(kind: str, config: Any, tokenizer: Any = None) -> tuple[str, dict]:
    """(family, HF config.json dict) of our model `kind` ("encoder" | "decoder") and config (a
    dataclass); a ValueError naming the field for anything transformers would not compute exactly."""
    c = config
    if kind == "decoder":
        family = _decoder_family(c)
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
    if kind != "encoder":
        raise ValueError(f"unknown model kind {kind!r}; known: {sorted(MODEL_KINDS)}")
    family = _encoder_family(c)
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


def _inverse(renames: dict[str, str]) -> tuple[dict[str, str], list[tuple[re.Pattern, str]]]:
    """ours -> HF name: exact names, and (pattern on ours, HF template) for per-layer names."""
    exact, templated = {}, []
    for hf, ours in renames.items():
        if "{l}" in ours:
            templated.append((re.compile("^" + re.escape(ours).replace(r"\{l\}", r"(\d+)") + "$"), hf))
        else:
            exact[ours] = hf
    return exact, templated


def hf_state(family: str, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Our state dict -> (HF state dict of `family`, our tensors the layout drops). Every other
    tensor must find its HF name (else a ValueError naming it: a tensor is never dropped silently)."""
    renames, prefix, heads, qkv = FAMILIES[family]
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
        m = re.match(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", ours) if family != "gpt2" else None
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
    # transformers 5 ties the vocabulary projection's bias to the head's bias only when it ties the
    # weights: an untied head would get a fresh decoder.bias, so the copy is written (the importers
    # read the head's bias and check or ignore the copy)
    for bias, copy in (("cls.predictions.bias", "cls.predictions.decoder.bias"), ("lm_head.bias", "lm_head.decoder.bias")):
        if bias in out:
            out[copy] = out[bias].clone()
    return out, dropped


# ------------------------------------------------------------------------------------ tokenizer
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
    lines = [f"# {src.name}", "", f"Exported by plm-workbench (plmodels.hf_export) from `{src}` as "
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
    state, dropped = hf_state(family, model.state_dict())
    notes = []
    if dropped:
        notes.append(f"{hf_cfg['architectures'][0]} has no place for our {', '.join(dropped)}: dropped "
                     f"(the masked-LM function is unchanged)")
        warnings.warn(f"export_hf({src}): {notes[-1]}", stacklevel=2)
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
