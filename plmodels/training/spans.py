"""SpanBERT's training targets: span masking and the span-boundary objective (SBO).

Follows Joshi et al. (2020), "SpanBERT: Improving Pre-training by Representing and Predicting
Spans" (TACL), Sec. 3.1-3.2, and the authors' reference code, github.com/facebookresearch/SpanBERT:
`pretraining/fairseq/data/masking.py` (`PairWithSpanMaskingScheme.mask`, `span_masking`,
`merge_intervals`, `pad_to_len`), `pretraining/fairseq/data/no_nsp_span_bert_dataset.py` and
`pretraining/fairseq/models/pair_bert.py` (`BertPairTargetPredictionHead`, `MLPWithLayerNorm`),
with the options of the paper's pretraining command in `pretraining/README.md`
(`--geometric-p 0.2 --span-lower 1 --span-upper 10 --replacement-method span
--max-pair-targets 15 --pair-positional-embedding-size 200 --endpoints external`).

Span masking, per row:
- the budget is ceil(rate * n) masked tokens, n the row's real (non-special) tokens;
- until the budget is met: draw a length L in words from the geometric law p(1-p)^(L-1) on 1..10,
  renormalised (`span_length_probs`); draw an anchor token uniformly among the real tokens, and
  discard both draws if the anchor is already masked; the span starts at the first piece of the
  anchor's word and takes L whole words, stopping early once the budget is met;
- spans may run into earlier spans; overlapping *and adjacent* spans are merged into one, and
  the merged span is the unit of everything below;
- each merged span draws one action: 80% all its tokens become [MASK], 10% each becomes a random
  token, 10% it is kept (the paper's "replacement at the span level");
- SBO: every token x_i of a span (s..e) is also predicted from the boundary tokens x_{s-1} and
  x_{e+1} and a learned embedding of its position i - s inside the span:
  y_i = LN(GeLU(W2 LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s}])))), then scored against the vocabulary
  with the tied word embeddings. Only the first `max_pair_targets` (15) tokens of a span are SBO
  targets, as the reference truncates its pair targets; the others still count for the MLM loss.

Where this file differs from the reference code, on purpose:
- Rows here carry their specials ([CLS] A [SEP] B [SEP] [PAD]...); the reference masks the bare
  block before adding them. So anchors and the budget count real tokens only, a span stops at a
  special token, and a token right after a special starts a word whatever its text.
- The reference stops in the middle of a word once the budget is met; here the word in progress
  is completed, so spans are always whole words and a row may exceed the budget by less than one
  word's pieces.
- The reference leaves out of SBO the spans that touch either end of the block (whose boundary
  would be [CLS] or [SEP]); here a boundary may be a special token, so those spans are targets too.
  Only a span at the very edge of a row (no token before or after it) has no SBO target.
- Random replacements are uniform over the non-special ids, as `masking.mask_tokens` does; the
  reference samples them from the corpus' unigram distribution.
- The head returns the vectors before the vocabulary projection (the caller owns the tied decoder
  and the SBO output bias, which the reference keeps separate from the MLM bias). Its second layer
  maps d_model -> embedding_width, which equals d_model in the reference (no factorised embeddings).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from plmodels.components.layers import ACTIVATIONS, init_weights
from plmodels.config import Config
from plmodels.training.masking import IGNORE_INDEX, special_mask

MAX_PAIR_TARGETS = 15      # the paper's `--max-pair-targets` (the argparse default is 20)
POSITION_WIDTH = 200       # `BertPairTargetPredictionHead`'s position_embedding_size


@dataclass(frozen=True)
class SpanMasking:
    """One batch's span masks. All tensors are (B, T) long unless said otherwise.

    input_ids: the corrupted ids. labels: the original id where masked, -100 elsewhere.
    left / right: index of the token just before / after the token's (merged) span, -1 where not
    masked or where the span touches the row's edge. rel_pos: position of the token inside its
    span, 0 at the span start (not clipped), -1 where not masked. sbo: (B, T) bool, True where the
    token is an SBO target (masked, both boundaries exist, rel_pos < max_pair_targets).
    span_lengths: the sampled length in words of every span placed, before it was cut short by the
    budget, a special token or the row's end (the lengths follow `span_length_probs`).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    rel_pos: torch.Tensor
    sbo: torch.Tensor
    span_lengths: list[int]


@dataclass(frozen=True)
class SpanConfig(Config):
    """SpanBERT's training fields (`PretrainConfig.objective_args` of objective "span")."""

    p: float = 0.2  # geometric parameter of span lengths (in words)
    max_span: int = 10  # longest span, in words (the law is truncated and renormalised)
    max_pair_targets: int = 15  # SBO positions: tokens further into a span are MLM targets only
    sbo_weight: float = 1.0  # loss = MLM + sbo_weight * SBO

    def __post_init__(self) -> None:
        if not 0.0 < self.p < 1.0:
            raise ValueError(f"SpanConfig.p must be in (0, 1), got {self.p}")
        if self.max_span < 1 or self.max_pair_targets < 1 or self.sbo_weight < 0:
            raise ValueError("SpanConfig: max_span and max_pair_targets must be >= 1 and sbo_weight >= 0")


def span_length_probs(p: float = 0.2, max_len: int = 10) -> torch.Tensor:
    """(max_len,) float64: P(L = k) for k = 1..max_len, the geometric law p(1-p)^(k-1) renormalised."""
    if not 0.0 < p <= 1.0 or max_len < 1:
        raise ValueError(f"span_length_probs needs p in (0, 1] and max_len >= 1, got p={p}, max_len={max_len}")
    k = torch.arange(max_len, dtype=torch.float64)
    w = p * (1.0 - p) ** k
    return w / w.sum()


def _word_bounds(special: list[bool], starts: list[bool]) -> tuple[list[int], list[int]]:
    """Per position: the first index of its word and the index one past its last piece.

    A special token is a word of its own and the token after it always starts a word, so a word
    (and therefore a span) never contains a special token.
    """
    T = len(special)
    is_start = [starts[t] or special[t] or t == 0 or special[t - 1] for t in range(T)]
    begin, end = [0] * T, [T] * T
    for t in range(T):
        begin[t] = t if is_start[t] else begin[t - 1]
    for t in range(T - 2, -1, -1):
        end[t] = t + 1 if is_start[t + 1] else end[t + 1]
    return begin, end


def _draws(probs: torch.Tensor, real: torch.Tensor, chunk: int, g: torch.Generator) -> Iterator[tuple[int, int]]:
    """Endless (length in words, anchor position) pairs, drawn from `g` in chunks (fewer tiny calls)."""
    while True:
        lengths = (torch.multinomial(probs, chunk, replacement=True, generator=g) + 1).tolist()
        anchors = real[torch.randint(len(real), (chunk,), generator=g)].tolist()
        yield from zip(lengths, anchors)


def _row_spans(special: list[bool], starts: list[bool], rate: float, probs: torch.Tensor,
               g: torch.Generator) -> tuple[list[list[int]], list[int]]:
    """One row's merged spans [[s, e], ...] (inclusive, sorted) and the sampled span lengths."""
    T = len(special)
    real = torch.tensor([t for t in range(T) if not special[t]], dtype=torch.long)
    if len(real) == 0:
        return [], []
    budget = math.ceil(rate * len(real))
    begin, end = _word_bounds(special, starts)
    masked, n, spans, lengths = [False] * T, 0, [], []
    draws = _draws(probs, real, budget + 8, g)
    while n < budget:
        L, anchor = next(draws)
        if masked[anchor]:
            continue  # the reference discards this length too and draws again
        s = t = begin[anchor]
        words = 0
        while words < L and t < T and not special[t] and n < budget:
            for i in range(t, end[t]):
                n += not masked[i]
                masked[i] = True
            t, words = end[t], words + 1
        spans.append([s, t - 1])
        lengths.append(L)
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1] + 1:  # overlapping or adjacent: one span
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged, lengths


def span_mask(
    input_ids: torch.Tensor,
    *,
    starts: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    generator: torch.Generator,
    rate: float = 0.15,
    p: float = 0.2,
    max_span: int = 10,
    mask_frac: float = 0.8,
    random_frac: float = 0.1,
    max_pair_targets: int = MAX_PAIR_TARGETS,
) -> SpanMasking:
    """SpanBERT's span masking of a batch (see the module docstring for the procedure).

    input_ids: (B, T) long; starts: (B, T) bool word starts (`masking.word_starts`). Specials are
    never masked and no span crosses one; all randomness comes from `generator`.
    """
    if input_ids.dim() != 2 or starts.shape != input_ids.shape:
        raise ValueError(f"input_ids and starts must both be (B, T), got {tuple(input_ids.shape)}, "
                         f"{tuple(starts.shape)}")
    if not 0.0 < rate <= 1.0 or mask_frac < 0 or random_frac < 0 or mask_frac + random_frac > 1.0 + 1e-9:
        raise ValueError(f"bad fractions: rate={rate}, mask_frac={mask_frac}, random_frac={random_frac}")
    if max_pair_targets < 1:
        raise ValueError(f"max_pair_targets must be >= 1, got {max_pair_targets}")
    probs = span_length_probs(p, max_span)
    specials = {int(i) for i in special_ids} | {int(mask_id)}
    allowed = torch.tensor([i for i in range(vocab_size) if i not in specials], dtype=input_ids.dtype)
    is_special = special_mask(input_ids, specials).tolist()
    starts_rows = starts.tolist()
    B, T = input_ids.shape
    corrupted = input_ids.clone()
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    left, right, rel_pos = (torch.full((B, T), -1, dtype=torch.long) for _ in range(3))
    all_lengths: list[int] = []
    for b in range(B):
        spans, lengths = _row_spans(is_special[b], starts_rows[b], rate, probs, generator)
        all_lengths += lengths
        action = torch.rand(len(spans), generator=generator).tolist()  # one draw per merged span
        random_ids = allowed[torch.randint(len(allowed), (T,), generator=generator)]
        for (s, e), u in zip(spans, action):
            labels[b, s:e + 1] = input_ids[b, s:e + 1]
            left[b, s:e + 1] = s - 1  # -1 when s == 0: no left boundary
            right[b, s:e + 1] = e + 1 if e + 1 < T else -1
            rel_pos[b, s:e + 1] = torch.arange(e - s + 1)
            if u < mask_frac:
                corrupted[b, s:e + 1] = mask_id
            elif u < mask_frac + random_frac:
                corrupted[b, s:e + 1] = random_ids[s:e + 1]
    sbo = (labels != IGNORE_INDEX) & (left >= 0) & (right >= 0) & (rel_pos < max_pair_targets)
    return SpanMasking(corrupted, labels, left, right, rel_pos, sbo, all_lengths)


def sbo_targets(masking: SpanMasking) -> tuple[torch.Tensor, ...]:
    """The SBO targets flattened in row-major order: (batch_index, left, right, rel_pos, targets), each (M,).

    M = masking.sbo.sum(): the masked positions, in the order of labels[labels != -100], less the
    tokens past the first max_pair_targets of a span and those of a span at a row's edge.
    """
    batch_index, pos = masking.sbo.nonzero(as_tuple=True)  # row-major
    return (batch_index, masking.left[batch_index, pos], masking.right[batch_index, pos],
            masking.rel_pos[batch_index, pos], masking.labels[batch_index, pos])


class SpanBoundaryHead(nn.Module):
    """SpanBERT's SBO head: a 2-layer FFN with `activation` and LayerNorm over [x_left; x_right; p_rel].

    Returns (M, embedding_width) vectors; the caller scores them against the vocabulary with the
    model's tied word embeddings, e.g. F.linear(h, word_embedding_weight, sbo_bias).
    """

    def __init__(self, d_model: int, embedding_width: int, max_pair_targets: int = MAX_PAIR_TARGETS,
                 activation: str = "gelu", layer_norm_eps: float = 1e-12, position_width: int = POSITION_WIDTH):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.act = ACTIVATIONS[activation]
        self.position = nn.Embedding(max_pair_targets, position_width)
        self.dense1 = nn.Linear(2 * d_model + position_width, d_model)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dense2 = nn.Linear(d_model, embedding_width)
        self.norm2 = nn.LayerNorm(embedding_width, eps=layer_norm_eps)
        self.apply(init_weights)

    def forward(self, hidden: torch.Tensor, left: torch.Tensor, right: torch.Tensor, rel_pos: torch.Tensor,
                batch_index: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, D); left, right, rel_pos, batch_index (M,) long (from `sbo_targets`) -> (M, E)."""
        x = torch.cat([hidden[batch_index, left],     # (M, D) left boundary
                       hidden[batch_index, right],    # (M, D) right boundary
                       self.position(rel_pos)], -1)   # (M, 2D + P)
        h = self.norm1(self.act(self.dense1(x)))      # (M, D)
        return self.norm2(self.act(self.dense2(h)))   # (M, E)

