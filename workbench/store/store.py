"""The store folder: its on-disk layout and `Store`, read access through memory-mapped arrays.

Layout (docs/design.md "Activation store"): one folder per key (`keys`), holding
- `index.json`: model_id, model_kind, n_layers (= L + 1: embeddings then each block), d_model,
  n_words, n_sentences, pooling, tokenizer_fingerprint, dtype ("float16"), attn_dtype ("float32"),
  created, data_hash, key, alignment counts, and for attention n_attn_layers, n_heads, special_tokens
  and attention_weighting ("raw": probabilities; "norm": Kobayashi et al. 2020's alpha ||f(x)||,
  renormalised per row; stores written before the option have no entry and are "raw");
- `layer_{l}.f16`: raw float16 (n_words, d_model), row `sent_offsets[s] + i` = word i of sentence s;
- `sent_offsets.npy`: (S + 1,) int64;
- with attentions: `attn.f32` flat, sentence s at element `attn_offsets[s]` shaped (L, H, n_s, n_s);
  `attn_offsets.npy` (S + 1,); `special.f32` (n_words, L, H, K) rows aligned with the layers: the
  attention share of each word to the K special tokens (`special_tokens` in the index: "[CLS]",
  "[SEP]" for WordPiece encoders, "BOS" for byte-level decoders; see `word_attention`).

`extraction` writes this layout; `Store` only reads it, through read-only memory maps.

Attention is kept in float32 (version 2; version 1 kept float16): the head statistics take argmaxes
over these maps, and float16's ~3 significant digits turned near-equal weights into exact ties that
broke to the lowest index. On all-MiniLM-L6-v2 and 400 EWT dev sentences that moved block 0 head 2's
share of words attending most to the previous word from 0.926 (float64) to 0.950.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

STORE_VERSION = 2
INDEX_FILE = "index.json"
ATTN_FILE, SPECIAL_FILE, ATTN_BYTES = "attn.f32", "special.f32", 4   # word-level attention, float32


class Store:
    """Read access to one activation-store folder (the layout is in the module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        idx = self.path / INDEX_FILE
        if not idx.is_file():
            raise FileNotFoundError(f"{self.path} is not an activation store (no {INDEX_FILE})")
        self.index = json.loads(idx.read_text(encoding="utf-8"))
        if self.index.get("version") != STORE_VERSION:
            raise ValueError(f"{idx}: store version {self.index.get('version')!r}, expected {STORE_VERSION}")
        self.sent_offsets = np.load(self.path / "sent_offsets.npy")
        self._attn_offsets = np.load(self.path / "attn_offsets.npy") if self.has_attentions else None
        self._attn = None
        self._special = None

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Store":
        return cls(path)

    # metadata
    n_layers = property(lambda self: int(self.index["n_layers"]))
    d_model = property(lambda self: int(self.index["d_model"]))
    n_words = property(lambda self: int(self.index["n_words"]))
    n_sentences = property(lambda self: int(self.index["n_sentences"]))
    pooling = property(lambda self: self.index["pooling"])
    has_attentions = property(lambda self: bool(self.index.get("attentions", False)))

    @property
    def attention_weighting(self) -> str | None:
        """"raw" or "norm" (extraction's `attention_weighting`) for a store with attentions, else None;
        stores written before the option are "raw"."""
        return self.index.get("attention_weighting", "raw") if self.has_attentions else None

    def sentence_rows(self, s: int) -> slice:
        """Global rows of sentence s's (kept) words."""
        return slice(int(self.sent_offsets[s]), int(self.sent_offsets[s + 1]))

    def n_kept(self) -> np.ndarray:
        """(S,) words stored per sentence (fewer than the input only under truncation)."""
        return np.diff(self.sent_offsets)

    def layer(self, l: int) -> np.memmap:
        """Read-only float16 memmap (n_words, d_model) of layer l (0 = embeddings; -1 = last)."""
        L = self.n_layers
        if not -L <= l < L:
            raise IndexError(f"layer {l} out of range for a store with {L} layers (0..{L - 1})")
        l %= L
        if self.n_words == 0:  # numpy cannot map an empty file
            return np.zeros((0, self.d_model), dtype=np.float16)
        return np.memmap(self.path / f"layer_{l}.f16", dtype=np.float16, mode="r",
                         shape=(self.n_words, self.d_model))

    def layers(self, ls: Sequence[int] | None = None) -> np.ndarray:
        """(K, n_words, d_model) float16 stack of the given layers (all when None); a copy in RAM."""
        ls = range(self.n_layers) if ls is None else ls
        return np.stack([self.layer(l) for l in ls])

    def _attn_maps(self) -> tuple[np.memmap, np.memmap]:
        if not self.has_attentions:
            raise ValueError(f"store {self.path} was built without attentions (extract(..., attentions=True))")
        if self._attn is None:
            self._attn = np.memmap(self.path / ATTN_FILE, dtype=np.float32, mode="r")
            L, H, K = self.index["n_attn_layers"], self.index["n_heads"], len(self.index["special_tokens"])
            self._special = np.memmap(self.path / SPECIAL_FILE, dtype=np.float32, mode="r",
                                      shape=(self.n_words, L, H, K))
        return self._attn, self._special

    def sentence_attention(self, s: int) -> np.ndarray:
        """(L, H, n_s, n_s) float32 word-level attention of sentence s (row = attending word)."""
        attn, _ = self._attn_maps()
        n = int(self.sent_offsets[s + 1] - self.sent_offsets[s])
        L, H = self.index["n_attn_layers"], self.index["n_heads"]
        a, b = int(self._attn_offsets[s]), int(self._attn_offsets[s + 1])
        return attn[a:b].reshape(L, H, n, n)

    def sentence_special(self, s: int) -> np.ndarray:
        """(L, H, n_s, K) float32: attention of each word of sentence s to each special token."""
        _, special = self._attn_maps()
        return special[self.sentence_rows(s)].transpose(1, 2, 0, 3)

    def iter_sentence_attention(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Yield (s, word attention (L, H, n, n), special shares (L, H, n, K)) for every sentence."""
        for s in range(self.n_sentences):
            yield s, self.sentence_attention(s), self.sentence_special(s)

    def check_tokenizer(self, tokenizer) -> None:
        """ValueError unless `tokenizer` is the one this store was built with (by fingerprint)."""
        fp = tokenizer.fingerprint()
        if fp != self.index["tokenizer_fingerprint"]:
            raise ValueError(
                f"store {self.path} was built with tokenizer {self.index['tokenizer_fingerprint'][:12]}..., "
                f"not {fp[:12]}...: word rows would not match; extract a new store"
            )

    def __repr__(self) -> str:
        return (f"Store({self.path.name}: {self.n_sentences} sentences, {self.n_words} words, "
                f"{self.n_layers} layers x {self.d_model}, pooling={self.pooling}, attentions={self.has_attentions})")
