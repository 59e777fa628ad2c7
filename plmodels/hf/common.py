"""The readers every Hugging Face importer shares: weights, tokenizers, the import of a family whose
name map is one function, and HF's activation names.

Weights come from `model.safetensors` (or `pytorch_model.bin` through
`torch.load(weights_only=True)`, which refuses arbitrary pickles: a refused file is an
UnsafePickleError naming it, with how to convert it to safetensors in a trusted environment; the
workbench itself never unpickles it) or from a sharded checkpoint (`model.safetensors.index.json`, or
`pytorch_model.bin.index.json` with `pytorch_model-0000x-of-0000y.bin` shards, each shard read as an
unsharded file of its format): `read_hf_weights`. The tokenizer comes from the folder's own files
(`read_tokenizer`). `import_converted` is the whole importer of T5, BART and XLNet given their name
map. Nothing here imports `transformers`.
"""
from __future__ import annotations

import json
import pickle
import re
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from ..checkpoint import check_state, read_safetensors, save
from ..tokenizer import Tokenizer

# HF `hidden_act` -> our activation
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


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
