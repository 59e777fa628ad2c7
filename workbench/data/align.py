"""Subword alignment: pre-split sentences -> model input pieces that know which word each token is.

Edge probing (Tenney et al. 2019) and word-level attention (Clark et al. 2019) read one vector or
one attention row per *word*, while the model sees subwords. `align_sentences` encodes every
sentence with `Tokenizer.encode_words_batch` (works for any of our tokenizers: trained WordPiece,
byte-level BPE, imported BERT vocab) and cuts it into **pieces**: one model input sequence each,
with a token -> word map.

Sentences longer than the model's `max_positions` are handled by a policy (a registry):

- `truncate`: keep the longest prefix of words whose subwords fit (with the specials); later words
  are dropped from that sentence (the store holds only the kept words; `n_kept[s]` says how many),
  and targets touching them are skipped and counted by the caller (`extract_task`).
- `window`: overlapping windows of whole words, each at most `max_positions` tokens with the
  specials, advancing by half a window. Every word is *owned* by the window where it has the most
  context, i.e. where min(subwords to its left, subwords to its right) inside the window is largest
  (ties -> the earlier window); its vectors come from that window only. No word is dropped, unless
  one word alone is longer than a window (then it and the words after it are dropped as in
  `truncate`, and counted). Word-level attention needs one sequence per sentence, so attentions
  with `window` are refused by the store.

A piece: `ids` (T,) with specials, `tok_word` (T,) the word index (within the sentence) of each
token or -1 for specials, and `own` — the word indices this piece writes (a subset of its words).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

POLICIES: dict[str, Callable] = {}


@dataclass(frozen=True)
class Piece:
    """One model input sequence: a window (or all) of sentence `sent`.

    ids: (T,) int64 token ids, specials included.
    tok_word: (T,) int64 word index within the sentence per token, -1 for special tokens.
    own_words: (K,) word indices (within the sentence) whose vectors this piece provides.
    """

    sent: int
    ids: np.ndarray
    tok_word: np.ndarray
    own_words: np.ndarray


@dataclass
class Alignment:
    """The result of `align_sentences`.

    pieces: model inputs, in sentence order (one per sentence under `truncate`).
    n_words: (S,) words per input sentence; n_kept: (S,) words kept (== n_words unless dropped).
    n_truncated_sentences, n_dropped_words, n_windowed_sentences: counts for the report.
    n_empty_words: words that produced no subword (given [UNK], by the tokenizer).
    """

    pieces: list[Piece]
    n_words: np.ndarray
    n_kept: np.ndarray
    policy: str
    max_positions: int
    n_empty_words: int = 0
    n_windowed_sentences: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def n_truncated_sentences(self) -> int:
        return int((self.n_kept < self.n_words).sum())

    @property
    def n_dropped_words(self) -> int:
        return int((self.n_words - self.n_kept).sum())

    def report(self) -> dict:
        """Counts as a JSON-able dict (written into the store's index.json)."""
        return {
            "policy": self.policy,
            "max_positions": self.max_positions,
            "n_sentences": int(len(self.n_words)),
            "n_words": int(self.n_words.sum()),
            "n_truncated_sentences": self.n_truncated_sentences,
            "n_dropped_words": self.n_dropped_words,
            "n_windowed_sentences": self.n_windowed_sentences,
            "n_empty_words": self.n_empty_words,
        }


def _register(name: str):
    def deco(fn):
        POLICIES[name] = fn
        return fn
    return deco


def _split_specials(ids: list[int], spans: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The special tokens before the first word and after the last (e.g. [CLS] / [SEP], BOS / none)."""
    if not spans:
        return list(ids), []
    return list(ids[: spans[0][0]]), list(ids[spans[-1][1]:])


def _make_piece(sent: int, ids: list[int], spans, lo: int, hi: int, head, tail, own) -> Piece:
    """Piece of words lo..hi-1: head specials + their subwords + tail specials."""
    body = ids[spans[lo][0]: spans[hi - 1][1]] if hi > lo else []
    tok_ids = list(head) + body + list(tail)
    tok_word = np.full(len(tok_ids), -1, dtype=np.int64)
    base = spans[lo][0] if hi > lo else 0
    for w in range(lo, hi):
        s, e = spans[w]
        tok_word[len(head) + s - base: len(head) + e - base] = w
    return Piece(sent, np.asarray(tok_ids, dtype=np.int64), tok_word, np.asarray(own, dtype=np.int64))


def _fit_prefix(spans, start: int, budget: int) -> int:
    """Largest hi such that words start..hi-1 take at most `budget` subwords."""
    base = spans[start][0]
    hi = start
    while hi < len(spans) and spans[hi][1] - base <= budget:
        hi += 1
    return hi


@_register("truncate")
def _truncate(sent: int, ids, spans, max_positions: int) -> tuple[list[Piece], int]:
    head, tail = _split_specials(ids, spans)
    n = len(spans)
    if len(ids) <= max_positions or n == 0:
        return [_make_piece(sent, ids, spans, 0, n, head, tail, range(n))], n
    budget = max_positions - len(head) - len(tail)
    hi = _fit_prefix(spans, 0, budget)
    return [_make_piece(sent, ids, spans, 0, hi, head, tail, range(hi))], hi


@_register("window")
def _window(sent: int, ids, spans, max_positions: int) -> tuple[list[Piece], int]:
    head, tail = _split_specials(ids, spans)
    n = len(spans)
    if len(ids) <= max_positions or n == 0:
        return [_make_piece(sent, ids, spans, 0, n, head, tail, range(n))], n
    budget = max_positions - len(head) - len(tail)
    windows: list[tuple[int, int]] = []
    lo = 0
    while lo < n:
        hi = _fit_prefix(spans, lo, budget)
        if hi == lo:  # one word longer than a window: stop here, the rest is dropped
            break
        windows.append((lo, hi))
        if hi == n:
            break
        # Next window starts half a window (in subwords) later, always advancing by >= 1 word.
        half = spans[lo][0] + max(1, (spans[hi - 1][1] - spans[lo][0]) // 2)
        nxt = lo + 1
        while nxt < hi and spans[nxt][0] < half:
            nxt += 1
        lo = nxt
    kept = windows[-1][1] if windows else 0
    # Owner of word w: the window maximising min(left context, right context) in subwords.
    best = np.full(kept, -1, dtype=np.int64)
    best_ctx = np.full(kept, -1, dtype=np.int64)
    for k, (lo, hi) in enumerate(windows):
        for w in range(lo, hi):
            ctx = min(spans[w][0] - spans[lo][0], spans[hi - 1][1] - spans[w][1])
            if ctx > best_ctx[w]:
                best_ctx[w], best[w] = ctx, k
    pieces = [
        _make_piece(sent, ids, spans, lo, hi, head, tail, np.flatnonzero(best == k))
        for k, (lo, hi) in enumerate(windows)
    ]
    return pieces, kept


def align_sentences(tokenizer, sentences: list[list[str]], max_positions: int,
                    policy: str = "truncate") -> Alignment:
    """Encode `sentences` (lists of words) into model pieces of at most `max_positions` tokens.

    Returns an `Alignment` (pieces, words kept per sentence, counts). Unknown policy -> ValueError.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown alignment policy {policy!r}; known: {sorted(POLICIES)}")
    if max_positions < 3:
        raise ValueError(f"max_positions must be >= 3 (specials + one subword), got {max_positions}")
    encs = tokenizer.encode_words_batch([list(ws) for ws in sentences], add_special=True)
    fn = POLICIES[policy]
    pieces: list[Piece] = []
    n_words = np.zeros(len(sentences), dtype=np.int64)
    n_kept = np.zeros(len(sentences), dtype=np.int64)
    n_windowed = 0
    for s, enc in enumerate(encs):
        ps, kept = fn(s, list(enc.ids), list(enc.word_spans), max_positions)
        pieces.extend(ps)
        n_words[s] = len(enc.word_spans)
        n_kept[s] = kept
        n_windowed += len(ps) > 1
    return Alignment(pieces=pieces, n_words=n_words, n_kept=n_kept, policy=policy,
                     max_positions=max_positions, n_empty_words=sum(e.n_empty for e in encs),
                     n_windowed_sentences=n_windowed)
