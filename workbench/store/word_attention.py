"""Word-level attention: token attention maps -> word attention maps plus special-token shares.

Follows Clark et al. 2019, "What does BERT look at?", Sec. 3: the attention *to* a word is the
**sum** over its subwords, the attention *from* a word is the **mean** over its subwords, so each
word row (with the special shares) still sums to 1:
    W[i, j] = mean_{a in i} sum_{b in j} A[a, b],   S[i, k] = mean_{a in i} A[a, pos(k)].
That is W = R A P with R (n, T) the averaging matrix and P (T, n + K) the one-hot token -> column
map; it is computed per batch as two scatter-adds over A (`word_maps` holds the token -> column and
token -> row indices; no per-word Python loop). The K special columns are the tokens a
sentence is wrapped in (`special_token_columns`): "[CLS]", "[SEP]" for BERT and RoBERTa (<s>, </s>),
"BOS" for GPT-2-style decoders.

Norm-weighted maps (Kobayashi et al. 2020, "Attention is Not Only a Weight"): `renormalised_word_maps`
converts a token map alpha_ij ||f_h(x_j)|| with the same maps and rescales each word row (word
plus special columns) to sum 1; a row with no mass at all falls back to the raw attention's row.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch


def special_token_columns(tokenizer) -> tuple[tuple[str, ...], dict[int, int]]:
    """The special columns of `tokenizer`'s word attention maps: (their K names, {token id: column
    0..K-1}), from the tokens its sentences are wrapped in (`Tokenizer.special_affixes`): "[CLS]",
    "[SEP]" for a tokenizer with both roles (BERT; RoBERTa's <s>, </s>), "BOS" for a GPT-2-style one."""
    pre, post = tokenizer.special_affixes
    names = ("[CLS]", "[SEP]") if pre and post else ("BOS",) if pre else ()
    return names, {int(i): k for k, i in enumerate(pre + post)}


def word_attention_maps(att: torch.Tensor, tok_word: torch.Tensor, special_slot: torch.Tensor,
                        n_words: int, n_special: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token attention -> word attention (Clark et al. 2019) for a padded batch.

    att: (..., B, H, T, T) probabilities; tok_word: (B, T) word index per token, -1 elsewhere;
    special_slot: (B, T) special column (0..K-1) per special token, -1 elsewhere (padding: -1 in
    both, so it is dropped — its attention is 0 anyway). Returns word (..., B, H, n_words, n_words)
    and special (..., B, H, n_words, K) with W = R A P (sum over attended subwords, mean over
    attending ones).
    """
    return apply_word_maps(att, word_maps(tok_word, special_slot, n_words, n_special, att.dtype, att.device))


class WordMaps(NamedTuple):
    """A batch's token -> word maps (`word_maps`): where each token's attention goes and comes from."""

    col: torch.Tensor     # (B, T) int64: attended token -> column, word 0..n-1 or special n..n+K-1; n+K: dropped
    row: torch.Tensor     # (B, T) int64: attending token -> word row 0..n-1; n: not a word's subword (dropped)
    count: torch.Tensor   # (B, n) float: subwords per word (>= 1), the divisor of the mean over attending ones
    n_words: int
    n_special: int


def word_maps(tok_word: torch.Tensor, special_slot: torch.Tensor, n_words: int, n_special: int,
              dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> WordMaps:
    """The maps of `word_attention_maps` for a batch, as indices: the column each attended token
    sums into (its word, or its special column), the row each attending token averages into, and
    each word's subword count. They depend only on the batch, so a caller converting every layer
    builds them once. Padding goes to the dropped column and row (its attention is 0 anyway)."""
    C = n_words + n_special
    # Built in numpy: a handful of tiny tensor ops costs ~10 ms each in OpenMP synchronisation when
    # the CPU is shared, more than the conversion that uses them.
    tw, sl = tok_word.cpu().numpy(), special_slot.cpu().numpy()
    col = np.where(tw >= 0, tw, np.where(sl >= 0, n_words + sl, C))
    row = np.where(tw >= 0, tw, n_words)
    count = np.zeros((len(tw), n_words + 1), dtype=np.float64)
    np.add.at(count, (np.arange(len(tw))[:, None], row), 1.0)
    count = np.maximum(count[:, :n_words], 1.0)
    return WordMaps(torch.from_numpy(np.ascontiguousarray(col)).to(device),
                    torch.from_numpy(np.ascontiguousarray(row)).to(device),
                    torch.from_numpy(count).to(device, dtype), n_words, n_special)


def apply_word_maps(att: torch.Tensor, maps: WordMaps) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention (..., B, H, T, T) -> (word (..., B, H, n, n), special (..., B, H, n, K)): W = R A P
    as two scatter-adds (each attended token's column into its word's, each attending token's row
    into its word's, then divided by the word's subword count): memory-bound passes over A instead
    of B x H small matrix products (4x faster on the extraction's batches)."""
    *lead, B, H, T, _ = att.shape
    n, C = maps.n_words, maps.n_words + maps.n_special
    col, row, count = (t.to(att.device) for t in (maps.col, maps.row, maps.count))
    X = math.prod(lead)
    a = att.reshape(X, B, H * T, T)
    cols = a.new_zeros(X, B, H * T, C + 1).scatter_add_(3, col[None, :, None, :].expand(X, B, H * T, T), a)
    cols = cols.view(X, B, H, T, C + 1)
    out = a.new_zeros(X, B, H, n + 1, C + 1).scatter_add_(
        3, row[None, :, None, :, None].expand(X, B, H, T, C + 1), cols)
    out = (out[:, :, :, :n, :C] / count.to(a.dtype)[None, :, None, :, None]).reshape(*lead, B, H, n, C)
    return out[..., :n], out[..., n:]


def renormalised_word_maps(weighted: torch.Tensor, raw: torch.Tensor,
                           maps: WordMaps) -> tuple[torch.Tensor, torch.Tensor]:
    """Word maps of a non-negative weighted token map (..., B, H, T, T), e.g. Kobayashi et al.'s
    alpha_ij ||f_h(x_j)||, as distributions: R A P (the same subword -> word conversion as raw
    attention), then each word row, word plus special columns, divided by its sum, so that every
    consumer of raw maps (rows sum to 1) reads them unchanged.

    A row whose weighted mass is 0 (every token its subwords attend to has a zero vector, or the row
    is a padding word) takes the row of `raw` (the probabilities the weights came from) instead:
    without any norm to weigh by, the weights are all that is left, and the row stays a distribution
    with no 0/0. NaN rows (heads a pruned layer lacks) stay NaN. Returns (word (..., B, H, n, n),
    special (..., B, H, n, K))."""
    word, special = apply_word_maps(weighted, maps)
    mass = word.sum(-1, keepdim=True) + special.sum(-1, keepdim=True)  # (..., B, H, n, 1)
    empty = mass == 0
    scale = torch.where(empty, torch.ones_like(mass), mass)
    word, special = word / scale, special / scale
    if bool(empty.any()):
        raw_word, raw_special = apply_word_maps(raw, maps)
        word, special = torch.where(empty, raw_word, word), torch.where(empty, raw_special, special)
    return word, special
