"""The activation store: every layer's word vectors (and word-level attention) on disk, once.

Layout (docs/design.md "Activation store"): one folder per key = (model id — checkpoint hash or a
fingerprint of the weights —, data hash, pooling, tokenizer fingerprint, alignment policy,
`key_extra`), holding
- `index.json`: model_id, model_kind, n_layers (= L + 1: embeddings then each block), d_model,
  n_words, n_sentences, pooling, tokenizer_fingerprint, dtype ("float16"), created, data_hash, key,
  alignment counts, and for attention n_attn_layers, n_heads, special_tokens;
- `layer_{l}.f16`: raw float16 (n_words, d_model), row `sent_offsets[s] + i` = word i of sentence s;
- `sent_offsets.npy`: (S + 1,) int64;
- with attentions: `attn.f16` flat, sentence s at element `attn_offsets[s]` shaped (L, H, n_s, n_s);
  `attn_offsets.npy` (S + 1,); `special.f16` (n_words, L, H, K) rows aligned with the layers: the
  attention share of each word to the K special tokens (`special_tokens` in the index: "[CLS]",
  "[SEP]" for WordPiece encoders, "BOS" for byte-level decoders).

Word vectors pool a word's subwords by a registry (`POOLINGS`: first, last, mean subword; Tenney
et al. 2019 use span pooling over such word vectors). Word-level attention follows Clark et al.
2019, "What does BERT look at?", Sec. 3: the attention *to* a word is the **sum** over its
subwords, the attention *from* a word is the **mean** over its subwords, so each word row (with the
special shares) still sums to 1:
    W[i, j] = mean_{a in i} sum_{b in j} A[a, b],   S[i, k] = mean_{a in i} A[a, pos(k)].
Computed per batch as W = R @ A @ P with R (n, T) the averaging matrix and P (T, n + K) the one-hot
token -> column map (vectorised; no per-word Python loop).

Extraction streams length-sorted, token-budgeted batches through the model (SDPA unless attention
is requested), pools with index_select / index_add over a flat token -> word map, and `pwrite`s each
sentence's rows at their global offsets, so RAM is bounded by one batch whatever the dataset size.
It builds into a temporary sibling folder and renames it when complete: a killed extraction leaves
no store, only a temp folder that the next run deletes (restart, not resume).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

import plmodels
from workbench.core.io import atomic_dir, atomic_write_json, clean_stale_tmp
from workbench.core.progress import Progress
from workbench.data import tasks
from workbench.data.align import Piece, align_sentences

STORE_VERSION = 1
INDEX_FILE = "index.json"
DEFAULT_MAX_RAM = 4 * 2**30
SPECIAL_NAMES = {"wordpiece": ("[CLS]", "[SEP]"), "bpe": ("BOS",)}


class BudgetError(ValueError):
    """An extraction would exceed its disk or memory budget (the message gives the estimate)."""


# ------------------------------------------------------------------------------------ pooling
@dataclass(frozen=True)
class PoolPlan:
    """Flat token -> word map of one batch (all indices into the (B*T,) flattened tokens).

    tok_idx: (M,) owned tokens; tok_word: (M,) their local word (0..W-1), non-decreasing;
    first_idx / last_idx: (W,) first / last subword of each word; counts: (W,) subwords per word.
    """

    tok_idx: torch.Tensor
    tok_word: torch.Tensor
    first_idx: torch.Tensor
    last_idx: torch.Tensor
    counts: torch.Tensor


def _pool_first(h: torch.Tensor, p: PoolPlan) -> torch.Tensor:
    """h: (B*T, D) -> (W, D), the first subword of each word (BERT's NER convention)."""
    return h.index_select(0, p.first_idx)


def _pool_last(h: torch.Tensor, p: PoolPlan) -> torch.Tensor:
    """(B*T, D) -> (W, D), the last subword (sees the whole word in a causal decoder)."""
    return h.index_select(0, p.last_idx)


def _pool_mean(h: torch.Tensor, p: PoolPlan) -> torch.Tensor:
    """(B*T, D) -> (W, D), mean over each word's subwords."""
    out = torch.zeros(len(p.counts), h.shape[1], dtype=h.dtype, device=h.device)
    out.index_add_(0, p.tok_word, h.index_select(0, p.tok_idx))
    return out / p.counts.unsqueeze(1).to(h.dtype)


POOLINGS: dict[str, Callable[[torch.Tensor, PoolPlan], torch.Tensor]] = {
    "first": _pool_first,
    "last": _pool_last,
    "mean": _pool_mean,
}


# ------------------------------------------------------------------------------------ batches
@dataclass
class _Batch:
    ids: torch.Tensor          # (B, T)
    mask: torch.Tensor         # (B, T)
    plan: PoolPlan
    dest_rows: np.ndarray      # (W,) global word row of each local word
    pieces: list[Piece]
    word_base: np.ndarray      # (B + 1,) local word offset of each piece


MIN_FILL = 0.8  # a batch takes a sequence only if it is >= MIN_FILL * the batch's longest


def _make_batches(pieces: list[Piece], batch_tokens: int, max_attn_cells: int | None) -> list[list[int]]:
    """Greedy length-sorted batches: B * T_max <= batch_tokens (and B * T_max^2 <= max_attn_cells),
    and every sequence at least MIN_FILL * T_max long, so a batch computes at most 1 / MIN_FILL
    tokens (real + padding) per real one (EWT dev at 8192 tokens: 1.11 computed per real token instead of
    1.28 without this rule, 14 batches instead of 7)."""
    order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i].ids))
    batches, cur, cur_len = [], [], 0
    for i in order:
        t = len(pieces[i].ids)
        t_max = max(cur_len, t)
        fits = (len(cur) + 1) * t_max <= batch_tokens and t >= MIN_FILL * t_max
        if max_attn_cells is not None:
            fits = fits and (len(cur) + 1) * t_max * t_max <= max_attn_cells
        if cur and not fits:
            batches.append(cur)
            cur, t_max = [], t
        cur.append(i)
        cur_len = t_max
    if cur:
        batches.append(cur)
    return batches


def _build_batch(pieces: list[Piece], sent_offsets: np.ndarray, pad_id: int) -> _Batch:
    B = len(pieces)
    T = max(len(p.ids) for p in pieces)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    tok_idx, tok_word, dest, base = [], [], [], [0]
    for b, p in enumerate(pieces):
        ids[b, : len(p.ids)] = p.ids
        mask[b, : len(p.ids)] = 1
        n_own = len(p.own_words)
        if n_own and p.own_words[0] == 0 and p.own_words[-1] == n_own - 1:  # owns all its words 0..n-1
            t = np.flatnonzero(p.tok_word >= 0)
            local = p.tok_word[t]
        else:  # a window owning some of its words
            t = np.flatnonzero((p.tok_word >= 0) & np.isin(p.tok_word, p.own_words))
            local = np.searchsorted(p.own_words, p.tok_word[t])  # own_words is sorted
        tok_idx.append(b * T + t)
        tok_word.append(base[-1] + local)
        dest.append(sent_offsets[p.sent] + p.own_words)
        base.append(base[-1] + len(p.own_words))
    ti = np.concatenate(tok_idx) if tok_idx else np.zeros(0, np.int64)
    tw = np.concatenate(tok_word) if tok_word else np.zeros(0, np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(tw)) + 1] if len(tw) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(tw)] - 1 if len(tw) else np.zeros(0, np.int64)
    plan = PoolPlan(
        tok_idx=torch.from_numpy(ti), tok_word=torch.from_numpy(tw),
        first_idx=torch.from_numpy(ti[starts]), last_idx=torch.from_numpy(ti[ends]),
        counts=torch.from_numpy(np.bincount(tw, minlength=base[-1]).astype(np.int64)),
    )
    return _Batch(torch.from_numpy(ids), torch.from_numpy(mask), plan,
                  np.concatenate(dest).astype(np.int64) if dest else np.zeros(0, np.int64),
                  pieces, np.asarray(base, dtype=np.int64))


def _runs(rows: np.ndarray) -> list[tuple[int, int]]:
    """Split (W,) row ids into maximal runs of consecutive rows: [(local_start, local_end)]."""
    if len(rows) == 0:
        return []
    cut = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.r_[0, cut]
    ends = np.r_[cut, len(rows)]
    return list(zip(starts.tolist(), ends.tolist()))


# ---------------------------------------------------------------------------- word attention
def word_attention_maps(att: torch.Tensor, tok_word: torch.Tensor, special_slot: torch.Tensor,
                        n_words: int, n_special: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token attention -> word attention (Clark et al. 2019) for a padded batch.

    att: (..., B, H, T, T) probabilities; tok_word: (B, T) word index per token, -1 elsewhere;
    special_slot: (B, T) special column (0..K-1) per special token, -1 elsewhere (padding: -1 in
    both, so it is dropped — its attention is 0 anyway). Returns word (..., B, H, n_words, n_words)
    and special (..., B, H, n_words, K) with W = R A P (sum over attended subwords, mean over
    attending ones).
    """
    R, P = word_maps(tok_word, special_slot, n_words, n_special, att.dtype, att.device)
    return apply_word_maps(att, R, P, n_words)


def word_maps(tok_word: torch.Tensor, special_slot: torch.Tensor, n_words: int, n_special: int,
              dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The two 0/1-based maps of `word_attention_maps`: R (B, n, T) averages over a word's subwords
    (rows), P (B, T, n + K) sums the attended subwords into words and special columns. They depend
    only on the batch, so a caller converting every layer builds them once."""
    B, T = tok_word.shape
    C = n_words + n_special
    # Built in numpy: a handful of tiny tensor ops costs ~10 ms each in OpenMP synchronisation when
    # the CPU is shared, more than the matmuls that use them.
    tw, sl = tok_word.cpu().numpy(), special_slot.cpu().numpy()
    col = np.where(tw >= 0, tw, np.where(sl >= 0, n_words + sl, C))
    bi, ti = np.arange(B)[:, None], np.arange(T)[None, :]
    P = np.zeros((B, T, C + 1), dtype=np.float32)
    P[bi, ti, col] = 1.0                                           # padding -> the dropped column C
    R = np.zeros((B, n_words + 1, T), dtype=np.float32)
    R[bi, np.where(tw >= 0, tw, n_words), ti] = 1.0
    R = R[:, :n_words]
    R /= np.maximum(R.sum(-1, keepdims=True), 1.0)                 # mean over attending subwords
    return (torch.from_numpy(np.ascontiguousarray(R)).to(device, dtype),      # (B, n, T)
            torch.from_numpy(np.ascontiguousarray(P[..., :C])).to(device, dtype))  # (B, T, C)


def apply_word_maps(att: torch.Tensor, R: torch.Tensor, P: torch.Tensor, n_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """R A P for attention (..., B, H, T, T) -> (word (..., B, H, n, n), special (..., B, H, n, K))."""
    H, T, C = att.shape[-3], att.shape[-1], P.shape[-1]
    AP = att.reshape(*att.shape[:-3], H * T, T) @ P                # (..., B, H T, C): one bmm over B
    out = R.unsqueeze(-3) @ AP.view(*att.shape[:-1], C)            # (..., B, H, n, C)
    return out[..., :n_words], out[..., n_words:]


# ---------------------------------------------------------------------------------- the store
class Store:
    """Read access to one activation-store folder (see module docstring for the layout)."""

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
            self._attn = np.memmap(self.path / "attn.f16", dtype=np.float16, mode="r")
            L, H, K = self.index["n_attn_layers"], self.index["n_heads"], len(self.index["special_tokens"])
            self._special = np.memmap(self.path / "special.f16", dtype=np.float16, mode="r",
                                      shape=(self.n_words, L, H, K))
        return self._attn, self._special

    def sentence_attention(self, s: int) -> np.ndarray:
        """(L, H, n_s, n_s) float16 word-level attention of sentence s (row = attending word)."""
        attn, _ = self._attn_maps()
        n = int(self.sent_offsets[s + 1] - self.sent_offsets[s])
        L, H = self.index["n_attn_layers"], self.index["n_heads"]
        a, b = int(self._attn_offsets[s]), int(self._attn_offsets[s + 1])
        return attn[a:b].reshape(L, H, n, n)

    def sentence_special(self, s: int) -> np.ndarray:
        """(L, H, n_s, K) float16: attention of each word of sentence s to each special token."""
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


# ------------------------------------------------------------------------------------- keys
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


def _store_dir(root: Path, key: str, pooling: str, attentions: bool) -> Path:
    return root / f"{pooling}-{key}{'-attn' if attentions else ''}"


# --------------------------------------------------------------------------------- estimates
@dataclass(frozen=True)
class Estimate:
    """Bytes an extraction needs: on disk (the store) and in RAM (peak of one batch)."""

    disk: int
    ram: int

    def __str__(self) -> str:
        return f"disk {self.disk / 2**20:.1f} MiB, peak RAM {self.ram / 2**20:.1f} MiB"


def estimate_bytes(n_layers: int, d_model: int, n_heads: int, sent_words: np.ndarray,
                   batch_shapes: list[tuple[int, int]], attentions: bool, n_special: int,
                   param_bytes: int = 0) -> Estimate:
    """Disk = (L+1) N D 2 [+ sum_s n_s^2 L H 2 + N L H K 2]; RAM = params + max over batches of
    (L+1) B T D 4 x 3 (hidden states, their pooled copies, model work space) [+ L B H T T 4 x 2]."""
    L1, N = n_layers + 1, int(sent_words.sum())
    disk = L1 * N * d_model * 2
    if attentions:
        disk += int((sent_words.astype(np.int64) ** 2).sum()) * n_layers * n_heads * 2
        disk += N * n_layers * n_heads * n_special * 2
    peak = 0
    for B, T in batch_shapes:
        ram = L1 * B * T * d_model * 4 * 3
        if attentions:
            ram += n_layers * B * n_heads * T * T * 4 * 2
        peak = max(peak, ram)
    return Estimate(disk=int(disk), ram=int(param_bytes + peak))


# ---------------------------------------------------------------------------------- extraction
PRECISIONS = ("fp32", "bf16")


def _forward(model, ids, mask, attentions: bool, precision: str = "fp32"):
    """The model's forward for extraction; precision "bf16" runs it under bf16 autocast (matmuls
    and softmax in bfloat16, as `plmodels.train` trains), "fp32" in full precision."""
    kw = dict(attention_mask=mask, output_hidden_states=True, output_attentions=attentions,
              attn_impl="eager" if attentions else "sdpa", unpad=True)  # padding rows are never read
    if getattr(model, "kind", "encoder") == "decoder":
        kw["return_logits"] = False
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        return model(ids, **kw)


def _special_slots(tokenizer) -> tuple[tuple[str, ...], dict[int, int]]:
    names = SPECIAL_NAMES[tokenizer.kind]
    ids = [tokenizer.cls_id, tokenizer.sep_id] if tokenizer.kind == "wordpiece" else [tokenizer.bos_id]
    return names, {int(i): k for k, i in enumerate(ids)}


def _write_batch(batch: _Batch, out: np.ndarray, fds: list[int], bytes_per_row: int) -> None:
    """pwrite every run of consecutive global rows of `out` (L+1, W, D) float16 into the layer files."""
    for a, b in _runs(batch.dest_rows):
        off = int(batch.dest_rows[a]) * bytes_per_row
        for l, fd in enumerate(fds):
            os.pwrite(fd, out[l, a:b].tobytes(), off)


def _write_attention(batch: _Batch, atts, tokenizer_slots: dict[int, int], n_special: int, n_heads: int,
                     attn_fd: int, special_fd: int, attn_offsets: np.ndarray, sent_offsets: np.ndarray) -> None:
    """Convert a batch's token attentions (L tensors (B, H_l, T, T)) to word level and write them."""
    L = len(atts)
    B, T = batch.ids.shape
    tok_word = np.full((B, T), -1, dtype=np.int64)  # numpy: tiny per-row ops, no OpenMP round trips
    for b, p in enumerate(batch.pieces):
        tok_word[b, : len(p.ids)] = p.tok_word
    ids, real = batch.ids.numpy(), batch.mask.numpy().astype(bool)
    slot = np.full((B, T), -1, dtype=np.int64)
    for tid, k in tokenizer_slots.items():
        slot[(ids == tid) & (tok_word < 0) & real] = k
    n_max = int(tok_word.max(initial=-1)) + 1
    tok_word, slot = torch.from_numpy(tok_word), torch.from_numpy(slot)
    alloc = np.empty if all(a.shape[1] == n_heads for a in atts) else partial(np.full, fill_value=np.nan)
    word = alloc((L, B, n_heads, n_max, n_max), dtype=np.float16)
    special = alloc((L, B, n_heads, n_max, n_special), dtype=np.float16)
    R, P = word_maps(tok_word, slot, n_max, n_special)  # once per batch, shared by every layer
    for l, a in enumerate(atts):  # layer by layer (no stacked copy); pruned layers' missing heads stay NaN
        w, sp = apply_word_maps(a.float(), R, P, n_max)  # (B, H_l, n, n), (B, H_l, n, K)
        # to float16 in torch (vectorised), not by numpy's assignment cast: 5x faster
        word[l, :, : a.shape[1]] = w.to(torch.float16).numpy()
        special[l, :, : a.shape[1]] = sp.to(torch.float16).numpy()
    for b, p in enumerate(batch.pieces):
        n = len(p.own_words)
        s = p.sent
        os.pwrite(attn_fd, np.ascontiguousarray(word[:, b, :, :n, :n]).tobytes(), int(attn_offsets[s]) * 2)
        rows = np.ascontiguousarray(special[:, b, :, :n].transpose(2, 0, 1, 3))  # (n, L, H, K)
        os.pwrite(special_fd, rows.tobytes(), int(sent_offsets[s]) * L * n_heads * n_special * 2)


def extract(model, tokenizer, sentences: Sequence[Sequence[str]], store_root: str | os.PathLike, *,
            key_extra: str = "", model_id: str | None = None, pooling: str = "first",
            attentions: bool = False, policy: str = "truncate", batch_tokens: int = 8192,
            max_bytes_disk: int | None = None, max_bytes_ram: int | None = DEFAULT_MAX_RAM,
            precision: str = "fp32", progress: bool = True) -> Store:
    """Extract every layer's pooled word vectors (and, on request, word-level attention) to a store.

    sentences: S lists of words. model_id: the checkpoint hash when known (else the weights are
    fingerprinted). Returns the existing store when one with the same key exists (a store built
    with attentions also serves requests without). Raises BudgetError when the estimate exceeds
    `max_bytes_disk` (default: the free space) or `max_bytes_ram`; ValueError on a bad pooling,
    policy, precision, or attentions with policy="window".

    precision: "fp32" (default, exact) or "bf16": the forward under bf16 autocast, about 2x faster
    on CPUs with AVX512-BF16/AMX and on GPUs. Its vectors and attention maps differ from fp32 by
    bf16 rounding (docs/benchmarks.md measures how much); it is part of the store key.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; known: {sorted(POOLINGS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {list(PRECISIONS)}")
    if attentions and policy != "truncate":
        raise ValueError("attentions need policy='truncate' (word attention needs one sequence per sentence)")
    root = Path(store_root)
    tok_fp = tokenizer.fingerprint()
    mid = model_id or model_fingerprint(model)
    dhash = data_hash(sentences)
    key = store_key(mid, dhash, pooling, tok_fp, policy,
                    key_extra if precision == "fp32" else f"{key_extra};precision={precision}")
    for with_attn in ([True] if attentions else [True, False]):
        d = _store_dir(root, key, pooling, with_attn)
        if (d / INDEX_FILE).is_file():
            store = Store(d)
            store.check_tokenizer(tokenizer)
            return store
    target = _store_dir(root, key, pooling, attentions)
    clean_stale_tmp(root, target.name)

    cfg = model.config
    L, D = int(cfg.n_layers), int(cfg.d_model)
    heads = list(getattr(model, "n_heads_per_layer", [cfg.n_heads] * L))
    H = max(heads) if heads else 0
    align = align_sentences(tokenizer, [list(ws) for ws in sentences], int(cfg.max_positions), policy)
    sent_offsets = np.r_[0, np.cumsum(align.n_kept)].astype(np.int64)
    names, slots = _special_slots(tokenizer)
    K = len(names)
    batches = _make_batches(align.pieces, batch_tokens, None)
    shapes = [(len(b), max(len(align.pieces[i].ids) for i in b)) for b in batches]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    est = estimate_bytes(L, D, H, align.n_kept, shapes, attentions, K, params)
    disk_budget = max_bytes_disk if max_bytes_disk is not None else shutil.disk_usage(
        root if root.exists() else root.parent if root.parent.exists() else Path.cwd()).free
    if est.disk > disk_budget:
        raise BudgetError(f"extraction needs {est}: over the disk budget of {disk_budget / 2**20:.1f} MiB")
    if max_bytes_ram is not None and est.ram > max_bytes_ram:
        raise BudgetError(f"extraction needs {est}: over the RAM budget of {max_bytes_ram / 2**20:.1f} MiB "
                          f"(lower batch_tokens={batch_tokens})")

    device = next(model.parameters()).device
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    N = int(sent_offsets[-1])
    attn_offsets = np.r_[0, np.cumsum(align.n_kept.astype(np.int64) ** 2 * L * H)].astype(np.int64)
    was_training = model.training
    model.eval()
    root.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_dir(target) as tmp, torch.inference_mode():
            fds = []
            try:
                for l in range(L + 1):
                    fd = os.open(tmp / f"layer_{l}.f16", os.O_RDWR | os.O_CREAT, 0o644)
                    fds.append(fd)
                    os.ftruncate(fd, N * D * 2)
                attn_fd = special_fd = -1
                if attentions:
                    attn_fd = os.open(tmp / "attn.f16", os.O_RDWR | os.O_CREAT, 0o644)
                    os.ftruncate(attn_fd, int(attn_offsets[-1]) * 2)
                    special_fd = os.open(tmp / "special.f16", os.O_RDWR | os.O_CREAT, 0o644)
                    os.ftruncate(special_fd, N * L * H * K * 2)
                total = sum(len(p.ids) for p in align.pieces)
                pool = POOLINGS[pooling]
                with Progress(total, "extract", "tok", disable=not progress) as bar:
                    for idx in batches:
                        batch = _build_batch([align.pieces[i] for i in idx], sent_offsets, pad_id)
                        out = _forward(model, batch.ids.to(device), batch.mask.to(device), attentions, precision)
                        B, T = batch.ids.shape
                        pooled = np.empty((L + 1, len(batch.dest_rows), D), dtype=np.float16)
                        for l, h in enumerate(out.hidden_states):
                            pooled[l] = pool(h.reshape(B * T, D).float().cpu(), batch.plan).to(torch.float16).numpy()
                        _write_batch(batch, pooled, fds, D * 2)
                        if attentions:
                            _write_attention(batch, [a.cpu() for a in out.attentions], slots, K, H,
                                             attn_fd, special_fd, attn_offsets, sent_offsets)
                        del out, pooled
                        bar.update(int(batch.mask.sum()))
            finally:
                for fd in fds + ([attn_fd, special_fd] if attentions else []):
                    if fd >= 0:
                        os.close(fd)
            np.save(tmp / "sent_offsets.npy", sent_offsets)
            index = {
                "version": STORE_VERSION, "key": key, "model_id": mid,
                "model_kind": getattr(model, "kind", None), "n_layers": L + 1, "d_model": D,
                "n_words": N, "n_sentences": len(sentences), "pooling": pooling,
                "tokenizer_fingerprint": tok_fp, "dtype": "float16",
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "data_hash": dhash,
                "key_extra": key_extra, "attentions": attentions, "alignment": align.report(),
                "precision": precision,
                "estimate": {"disk": est.disk, "ram": est.ram},
            }
            if attentions:
                np.save(tmp / "attn_offsets.npy", attn_offsets)
                index.update(n_attn_layers=L, n_heads=H, heads_per_layer=heads, special_tokens=list(names))
            atomic_write_json(tmp / INDEX_FILE, index)
    finally:
        model.train(was_training)
    return Store(target)


# ----------------------------------------------------------------------------- probe inputs
@dataclass
class TaskArrays:
    """What the probes need for one task split (docs/design.md "Probe inputs").

    store: the activation store of the records' sentences (sentence s = record s).
    span1 / span2: (N_targets, 2) int64 *global* word rows (sent_offsets[s] + word index), end
    exclusive; span2 is None for single-span tasks. labels: (N_targets,) str.
    sent_index: (N_targets,) record/sentence index of each target.
    n_skipped: targets dropped because a span touches a word removed by truncation.
    """

    store: Store
    span1: np.ndarray
    span2: np.ndarray | None
    labels: np.ndarray
    sent_index: np.ndarray
    n_skipped: int


def task_arrays(store: Store, task_records: Sequence[dict]) -> TaskArrays:
    """Map the records' targets to global word rows of `store` (built from these records' words)."""
    if len(task_records) != store.n_sentences:
        raise ValueError(f"{len(task_records)} records but the store has {store.n_sentences} sentences")
    kept = store.n_kept()
    has2 = None
    s1, s2, labels, sents, skipped = [], [], [], [], 0
    for r, rec in enumerate(task_records):
        n = len(rec["words"])
        for t, tgt in enumerate(rec["targets"]):
            spans = [tgt["span1"]] + ([tgt["span2"]] if "span2" in tgt else [])
            if has2 is None:
                has2 = len(spans) == 2
            elif has2 != (len(spans) == 2):
                raise ValueError(f"record {rec.get('id', r)!r} target {t}: span2 present in some targets only")
            for a, b in spans:
                if not 0 <= a < b <= n:
                    raise ValueError(f"record {rec.get('id', r)!r} target {t}: span [{a}, {b}) outside 0..{n}")
            if max(b for _, b in spans) > kept[r]:
                skipped += 1
                continue
            off = int(store.sent_offsets[r])
            s1.append((off + spans[0][0], off + spans[0][1]))
            if has2:
                s2.append((off + spans[1][0], off + spans[1][1]))
            labels.append(str(tgt["label"]))
            sents.append(r)
    return TaskArrays(
        store=store,
        span1=np.asarray(s1, dtype=np.int64).reshape(-1, 2),
        span2=np.asarray(s2, dtype=np.int64).reshape(-1, 2) if has2 else None,
        labels=np.asarray(labels, dtype=object).astype(str),
        sent_index=np.asarray(sents, dtype=np.int64),
        n_skipped=skipped,
    )


def extract_task(model, tokenizer, task_records: Sequence[dict], store_root: str | os.PathLike,
                 **kwargs) -> TaskArrays:
    """`extract` on the records' sentences (one per record), then `task_arrays`. kwargs go to extract."""
    for r, rec in enumerate(task_records):
        if "words" not in rec or "targets" not in rec:
            raise ValueError(f"record {r} ({rec.get('id', '?')!r}) lacks 'words' or 'targets'")
    store = extract(model, tokenizer, [rec["words"] for rec in task_records], store_root, **kwargs)
    return task_arrays(store, task_records)


# ------------------------------------------------------------------------------------ the CLI
def load_sentences(data: str, limit: int | None = None) -> list[list[str]]:
    """Sentences named by `data`: "ewt:dev" / "gum:train" (UD treebank:split) or a task
    "pos" / "pos:dev" (records' words; split defaults to dev). `limit` keeps the first sentences."""

    name, _, split = data.partition(":")
    split = split or "dev"
    if name in tasks.UD_TREEBANKS:
        sents = [list(s.words) for s in tasks.ud_sentences(name, split)]
    elif name in tasks.TASKS:
        sents = [list(r["words"]) for r in tasks.load_task(name, split)]
    else:
        raise ValueError(f"unknown data {data!r}: use treebank:split ({sorted(tasks.UD_TREEBANKS)}) "
                         f"or task[:split] ({sorted(tasks.TASKS)})")
    return sents if limit is None else sents[:limit]


def extract_cli(model_path: str | os.PathLike, data: str, out_root: str | os.PathLike,
                pooling: str = "first", attentions: bool = False, policy: str = "truncate",
                limit: int | None = None, batch_tokens: int = 8192, precision: str = "fp32") -> Store:
    """`workbench extract`: load a checkpoint, read `data` (see load_sentences), extract to a store
    under `out_root` keyed by the checkpoint hash. Returns the store (existing or new)."""

    model, tokenizer = plmodels.load(model_path)
    sents = load_sentences(data, limit)
    return extract(model, tokenizer, sents, out_root, model_id=plmodels.checkpoint_hash(model_path),
                   key_extra=f"data={data};limit={limit}", pooling=pooling, attentions=attentions,
                   policy=policy, batch_tokens=batch_tokens, precision=precision)
