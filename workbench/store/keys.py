"""Store keys: which folder holds the vectors of a given model, data, pooling and tokenizer.

A store folder is `<root>/<pooling>-<key>[-attn]`, key = a short hash of (model id — checkpoint
hash or a fingerprint of the weights —, data hash, pooling, tokenizer fingerprint, alignment
policy, `key_extra`) and the store version (docs/design.md "Activation store"), so a changed input
never reads an old store and an unchanged one is never extracted twice.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import torch

from workbench.store.store import STORE_VERSION


def data_hash(sentences: Sequence[Sequence[str]]) -> str:
    """sha256 of the sentences' words (order matters)."""
    h = hashlib.sha256()
    for ws in sentences:
        h.update(json.dumps(list(ws), ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 of the model's kind, config and every tensor (use the checkpoint hash when you have one)."""
    h = hashlib.sha256()
    cfg = model.config.to_dict() if hasattr(model.config, "to_dict") else repr(model.config)
    h.update(json.dumps({"kind": getattr(model, "kind", None), "config": cfg}, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def store_key(model_id: str, data: str, pooling: str, tokenizer_fp: str, policy: str, key_extra: str = "") -> str:
    """The store folder's key: a short hash of everything that changes its contents."""
    blob = json.dumps([STORE_VERSION, model_id, data, pooling, tokenizer_fp, policy, key_extra])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def store_dir(root: Path, key: str, pooling: str, attentions: bool) -> Path:
    """The folder of the store with `key` under `root`: `<pooling>-<key>[-attn]`."""
    return root / f"{pooling}-{key}{'-attn' if attentions else ''}"
