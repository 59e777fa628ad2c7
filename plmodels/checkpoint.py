"""Checkpoint folders: save, load and hash a model with its tokenizer (docs/design.md, "Checkpoints").

Layout of a checkpoint folder:
    config.json        {"kind": "encoder" | "decoder" | "bilm" | "tbilm" | "seq2seq" | "xlnet",
                        "config": {...}}
                       (pruned heads included)
    model.safetensors  the state dict (safetensors only; nothing is ever unpickled)
    tokenizer/         Tokenizer.save output (absent when saved without a tokenizer)
    card.json          model card: data, steps, tokens, metrics, created, ... (free-form extras)
    README.md          the card as prose
Saving writes a temporary sibling folder and renames it into place, so a reader never sees half a
checkpoint. Tied weights are not a problem: the tied heads reuse the embedding matrix in
`F.linear` and own no parameter of their own, so the state dict holds each tensor once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from .decoder import Decoder, DecoderConfig
from .elmo import ElmoBiLM, ElmoConfig, TransformerBiLM, TransformerBiLMConfig
from .encoder import Encoder, EncoderConfig
from .files import save_safetensors
from .seq2seq import Seq2Seq, Seq2SeqConfig
from .tokenizer import Tokenizer
from .xlnet import XLNet, XLNetConfig

MODEL_KINDS: dict[str, tuple[type[nn.Module], type]] = {
    "encoder": (Encoder, EncoderConfig),
    "decoder": (Decoder, DecoderConfig),
    "bilm": (ElmoBiLM, ElmoConfig),  # ELMo's biLSTM LM (elmo.py)
    "tbilm": (TransformerBiLM, TransformerBiLMConfig),  # its transformer control (elmo.py)
    "seq2seq": (Seq2Seq, Seq2SeqConfig),  # T5 / BART encoder-decoder (seq2seq.py); analyses read its encoder
    "xlnet": (XLNet, XLNetConfig),  # XLNet's two-stream model (xlnet.py); analyses read its content stream
}
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_DIR, CARD_FILE, README_FILE = (
    "config.json", "model.safetensors", "tokenizer", "card.json", "README.md",
)


def build_model(kind: str, config: dict) -> nn.Module:
    """A freshly initialised model of `kind` (a key of MODEL_KINDS) in the config's (pruned) shape."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; known: {sorted(MODEL_KINDS)}")
    model_cls, config_cls = MODEL_KINDS[kind]
    return model_cls(config_cls.from_dict(config))


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model: nn.Module, tokenizer: Any, path: str | Path, card: dict | None = None) -> Path:
    """Write a checkpoint folder at `path` atomically (temp folder, then rename); returns the path.

    tokenizer: a plmodels Tokenizer or None. card: extra card fields (data, steps, tokens, metrics...).
    An existing folder at `path` is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        meta = {"kind": model.kind, "config": model.config.to_dict()}
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        # One metadata key only: safetensors writes metadata from a hash map, so several keys come
        # out in a random order and identical weights would hash differently (checkpoint_hash).
        save_safetensors(state, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_DIR)
        full_card = {
            "name": path.name,
            "kind": model.kind,
            "n_parameters": n_parameters(model),
            "n_heads_per_layer": list(model.n_heads_per_layer),
            "data": None,
            "steps": None,
            "tokens": None,
            "metrics": {},
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **(card or {}),
        }
        (tmp / CARD_FILE).write_text(json.dumps(full_card, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
        (tmp / README_FILE).write_text(card_prose(full_card, meta), encoding="utf-8")
        if path.exists():  # swap: old folder aside, new one in, old one deleted
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def card_prose(card: dict, meta: dict) -> str:
    """The model card as Markdown."""
    lines = [f"# {card.get('name', 'model')}", "", f"A {meta['kind']} saved by plm-workbench on {card.get('created')}.", ""]
    lines += ["## Architecture", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in meta["config"].items()]
    lines += ["", f"Parameters: {card.get('n_parameters')}; heads per layer: {card.get('n_heads_per_layer')}.", ""]
    lines += ["## Training", ""]
    for key in ("data", "steps", "tokens"):
        lines.append(f"- {key}: {card.get(key)}")
    metrics = card.get("metrics") or {}
    lines += ["", "## Metrics", ""] + ([f"- {k}: {v}" for k, v in metrics.items()] or ["(none)"])
    extras = {k: v for k, v in card.items() if k not in {"name", "kind", "n_parameters", "n_heads_per_layer", "data", "steps", "tokens", "metrics", "created"}}
    if extras:
        lines += ["", "## Notes", ""] + [f"- {k}: {json.dumps(v, default=str)}" for k, v in extras.items()]
    return "\n".join(lines) + "\n"


def check_state(expected: dict[str, torch.Tensor], found: dict[str, torch.Tensor], where: str) -> None:
    """Raise ValueError listing missing, extra and misshapen tensors (by name) between two state dicts."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    misshapen = sorted(
        f"{k}: expected {tuple(expected[k].shape)}, found {tuple(found[k].shape)}"
        for k in set(expected) & set(found)
        if expected[k].shape != found[k].shape
    )
    if missing or extra or misshapen:
        raise ValueError(f"{where}: state does not match the config; missing={missing} extra={extra} misshapen={misshapen}")


def load(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, Any]:
    """Read a checkpoint folder -> (model in eval mode on map_location, tokenizer or None).

    The model is built from config.json (pruned heads re-applied) before the weights are loaded.
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint folder (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    meta = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    if set(meta) - {"kind", "config"} or "kind" not in meta or "config" not in meta:
        raise ValueError(f"{path / CONFIG_FILE}: expected keys 'kind' and 'config', got {sorted(meta)}")
    model = build_model(meta["kind"], meta["config"])
    state = load_file(str(path / WEIGHTS_FILE), device="cpu")
    check_state(model.state_dict(), state, str(path / WEIGHTS_FILE))
    model.load_state_dict(state, strict=True)
    model.to(map_location).eval()
    tokenizer = None
    if (path / TOKENIZER_DIR).is_dir():
        tokenizer = Tokenizer.load(path / TOKENIZER_DIR)
    return model, tokenizer


def checkpoint_hash(path: str | Path) -> str:
    """sha256 (hex) over the bytes of config.json followed by model.safetensors."""
    path = Path(path)
    h = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(path / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
