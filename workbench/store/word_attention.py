"""Word-level attention: token attention maps -> word attention maps plus special-token shares.

Follows Clark et al. 2019, "What does BERT look at?", Sec. 3: the attention *to* a word is the
**sum** over its subwords, the attention *from* a word is the **mean** over its subwords, so each
word row (with the special shares) still sums to 1:
    W[i, j] = mean_{a in i} sum_{b in j} A[a, b],   S[i, k] = mean_{a in i} A[a, pos(k)].
Computed per batch as W = R @ A @ P with R (n, T) the averaging matrix and P (T, n + K) the one-hot
token -> column map (vectorised; no per-word Python loop). The K special columns are the tokens a
sentence is wrapped in (`special_token_columns`): "[CLS]", "[SEP]" for BERT and RoBERTa (<s>, </s>),
"BOS" for GPT-2-style decoders.

Norm-weighted maps (Kobayashi et al. 2020, "Attention is Not Only a Weight"): `renormalised_word_maps`
converts a token map alpha_ij ||f_h(x_j)|| with the same R and P and rescales each word row (word
plus special columns) to sum 1; a row with no mass at all falls back to the raw attention's row.
"""
from __future__ import annotations

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


def renormalised_word_maps(weighted: torch.Tensor, raw: torch.Tensor, R: torch.Tensor, P: torch.Tensor,
                           n_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Word maps of a non-negative weighted token map (..., B, H, T, T), e.g. Kobayashi et al.'s
    alpha_ij ||f_h(x_j)||, as distributions: R W P (the same subword -> word conversion as raw
    attention), then each word row, word plus special columns, divided by its sum, so that every
    consumer of raw maps (rows sum to 1) reads them unchanged.

    A row whose weighted mass is 0 (every token its subwords attend to has a zero vector, or the row
    is a padding word) takes the row of `raw` (the probabilities the weights came from) instead:
    without any norm to weigh by, the weights are all that is left, and the row stays a distribution
    with no 0/0. NaN rows (heads a pruned layer lacks) stay NaN. Returns (word (..., B, H, n, n),
    special (..., B, H, n, K))."""
    word, special = apply_word_maps(weighted, R, P, n_words)
    mass = word.sum(-1, keepdim=True) + special.sum(-1, keepdim=True)  # (..., B, H, n, 1)
    empty = mass == 0
    scale = torch.where(empty, torch.ones_like(mass), mass)
    word, special = word / scale, special / scale
    if bool(empty.any()):
        raw_word, raw_special = apply_word_maps(raw, R, P, n_words)
        word, special = torch.where(empty, raw_word, word), torch.where(empty, raw_special, special)
    return word, special
