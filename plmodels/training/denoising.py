"""Denoising targets for encoder-decoder pretraining: T5's span corruption and BART's text infilling.

T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", JMLR, Sec. 3.1.4 and 3.3), as the authors' code computes it
(google-research/text-to-text-transfer-transformer, t5/data/preprocessors.py:
`random_spans_noise_mask`, `noise_span_to_unique_sentinel`, `nonnoise_span_to_unique_sentinel`,
`span_corruption`), for a sequence of n tokens (no EOS yet):
- n' = max(n, 2); noise tokens N = clip(round(n' density), 1, n' - 1); spans S = max(round(N / mean), 1),
  where `round` is TensorFlow's (half to even) on float32 values, as `tf.round(tf.cast(..., tf.float32))`;
- `_random_segmentation(N, S)`: a uniformly shuffled vector of S - 1 ones among N - 1 slots, a 0
  prepended, cumulative-summed into segment ids: a uniform random split of N into S positive lengths;
  the same for the n' - N non-noise tokens;
- the spans are interleaved starting with non-noise: [non-noise 0, noise 0, non-noise 1, noise 1, ...],
  so a sequence always starts with kept tokens and ends with a noise span; the mask is cut to n;
- inputs: each noise span becomes one sentinel, <extra_id_0> for the first span, <extra_id_1> for the
  next, ...; targets: the same with the mask inverted, i.e. each *kept* span becomes a sentinel and
  the noise tokens stay: "<extra_id_0> span 0 <extra_id_1> span 1 ..."; both then end with EOS
  (seqio's `append_eos_after_trim`). T5's sentinel ids count down from the top of the vocabulary
  (<extra_id_i> = vocab_size - 1 - i, `t5_sentinel_ids`); here `sentinel_ids[i]` is <extra_id_i>.

BART (Lewis et al. 2020, "BART: Denoising Sequence-to-Sequence Pre-training", ACL, Sec. 2.2), as
fairseq's `DenoisingDataset` computes it (fairseq/data/denoising_dataset.py: `permute_sentences`,
`add_whole_word_mask` with mask_length="span-poisson" and replace_length=1, `add_insertion_noise`).
A sequence is [<s>, tokens..., </s>]; its first and last tokens are never touched:
- sentence permutation (optional, fairseq's permute_sentences=1.0): the sentences between <s> and
  </s> are put in a uniformly random order (the last token before </s> always ends a sentence);
- the budget is ceil(mask_ratio * W), W the word starts strictly inside the sequence (every token
  when `word_starts` is None: subword masking);
- span lengths are drawn from Poisson(lambda), truncated where the pmf falls below 1e-7 (fairseq's
  Categorical over k = 0..K), until they sum to at least the budget; the last one is cut so the sum
  is exactly the budget. Zero-length spans become insertions;
- span starts are distinct word starts drawn uniformly without replacement; each span draws once:
  with probability random_ratio its start token becomes a random id in [1, vocab_size), else
  <mask>; the span's other tokens are deleted (replace_length=1: one token per span). A span runs
  over L words (a word is a start and its continuation pieces) and stops before </s>. Spans may
  overlap: a start inside an earlier span is deleted with it, so the masked fraction ends a little
  under mask_ratio (~0.27 at 0.3, measured in the tests);
- insertions: k = (zero-length spans) tokens inserted at distinct random positions strictly between
  the first and the last token of the masked sequence; the first ceil(k random_ratio) of them are
  random ids, the others <mask> (fairseq's `add_insertion_noise`, which therefore makes at least one
  insertion a random token whenever there is one);
- the target is the original sequence (before permutation).

Alignments (`return_alignment=True`, for the cross-attention analysis; the outputs and the random
draws are the same without it): BART's `infilling_alignment` gives each target token the position of
its surviving copy in the corrupted input (-1 for masked, replaced or deleted tokens); T5's
`t5_sentinel_alignment` gives each target sentinel the position of the same sentinel in the inputs
(-1 for the span tokens and EOS).

Where this file differs from the authors' code:
- T5: TensorFlow's stateless seeds are replaced by a `torch.Generator` (same distributions, other
  draws). When there are fewer kept tokens than spans (density near 1) T5's code fails on a shape
  error; here it is a ValueError saying so.
- BART: fairseq recomputes the insertion count as ceil(len * (k / len)), which float rounding can
  make k + 1; here it is exactly k. Sentence ends are given as a mask (`sentence_ends`) instead of
  fairseq's search for the full-stop id, which also treats only the first of consecutive full stops
  as an end. The random draws come from `generator` rather than numpy's / torch's global state.
  Whole-word masking needs `word_starts` (fairseq derives it from the BPE vocabulary); with None it
  is subword masking (fairseq's default when no whole-word mask is given).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class T5Corruption:
    """One sequence's span corruption. inputs: (n - N + S + 1,) ids with sentinels and EOS; targets:
    (N + S + 1,) "sentinel span" pairs and EOS; noise_mask: (n,) bool, True on the noise tokens."""

    inputs: torch.Tensor
    targets: torch.Tensor
    noise_mask: torch.Tensor
    alignment: torch.Tensor | None = None  # (len(targets),) with return_alignment: `t5_sentinel_alignment`


@dataclass(frozen=True)
class BartNoising:
    """One sequence's BART noise. inputs: the corrupted ids (any length); targets: the original ids;
    masked: (T,) bool over the (permuted) sequence, True on every token some span covered;
    span_lengths: the span lengths after the budget cut, zero-length ones (insertions) included;
    alignment (with return_alignment=True): (T,) long, for each target token the input position of
    its surviving copy, -1 where it was masked or deleted (`infilling_alignment`)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    masked: torch.Tensor
    span_lengths: list[int]
    alignment: torch.Tensor | None = None


# ----------------------------------------------------------------------------------------- T5


def t5_sentinel_ids(vocab_size: int, n: int = 100) -> list[int]:
    """T5's extra ids: <extra_id_i> = vocab_size - 1 - i for i < n (counting down from the top)."""
    return [vocab_size - 1 - i for i in range(n)]


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _tf_round(x: torch.Tensor) -> int:
    """tf.round of a float32 value: half to even (190 * 0.15 is 28.500002 in float32 -> 29, not 28)."""
    return int(torch.round(x).item())


def _random_segmentation(num_items: int, num_segments: int, generator: torch.Generator) -> torch.Tensor:
    """T5's `_random_segmentation`: a uniformly random split of num_items into num_segments positive
    lengths, (num_segments,) long. Segment starts: S - 1 ones shuffled among the N - 1 gaps."""
    if num_items < num_segments:
        raise ValueError(f"cannot split {num_items} tokens into {num_segments} non-empty spans (T5's code "
                         "fails here too); lower noise_density or raise mean_span_length")
    first = torch.zeros(num_items, dtype=torch.long)
    ones = (torch.arange(num_items - 1) < num_segments - 1).long()
    first[1:] = ones[torch.randperm(num_items - 1, generator=generator)]
    return torch.bincount(first.cumsum(0), minlength=num_segments)  # (S,)


def random_spans_noise_mask(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0, *,
                            generator: torch.Generator) -> torch.Tensor:
    """T5's `random_spans_noise_mask` (random_roll=False): (length,) bool, True on noise tokens."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if not 0.0 < noise_density < 1.0 or not mean_span_length > 0:
        raise ValueError(f"need 0 < noise_density < 1 and mean_span_length > 0, got {noise_density}, {mean_span_length}")
    n = max(length, 2)
    num_noise = min(max(_tf_round(_f32(n) * _f32(noise_density)), 1), n - 1)
    num_spans = max(_tf_round(_f32(num_noise) / _f32(mean_span_length)), 1)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    kept_lengths = _random_segmentation(n - num_noise, num_spans, generator)
    interleaved = torch.stack([kept_lengths, noise_lengths], dim=1).reshape(-1)  # (2 S,) kept first
    starts = interleaved.cumsum(0)[:-1]  # (2 S - 1,) where each span after the first begins
    indicator = torch.zeros(n, dtype=torch.long).index_add_(0, starts, torch.ones_like(starts))
    return (indicator.cumsum(0) % 2 == 1)[:length]


def noise_span_to_unique_sentinel(ids: torch.Tensor, noise_mask: torch.Tensor, sentinel_ids: Sequence[int]) -> torch.Tensor:
    """T5's `noise_span_to_unique_sentinel`: each maximal run of noise tokens -> sentinel_ids[k] for
    the k-th run; ids, noise_mask (n,) -> (n - noise + runs,)."""
    prev = torch.cat([noise_mask.new_zeros(1), noise_mask[:-1]])
    first, subsequent = noise_mask & ~prev, noise_mask & prev
    k = first.long().cumsum(0) - 1  # run index at each first noise token
    if int(first.sum()) > len(sentinel_ids):
        raise ValueError(f"{int(first.sum())} noise spans but only {len(sentinel_ids)} sentinel ids")
    sentinels = torch.as_tensor(list(sentinel_ids), dtype=ids.dtype)
    out = torch.where(first, sentinels[k.clamp(min=0)], ids)
    return out[~subsequent]


def t5_sentinel_alignment(inputs: torch.Tensor, targets: torch.Tensor, sentinel_ids: Sequence[int]) -> torch.Tensor:
    """For each target position, the input position of the same sentinel (<extra_id_k> in the
    targets, which opens noise span k, to the <extra_id_k> that stands for that span in the inputs);
    -1 for every other target token (the span tokens, EOS). inputs (Te,), targets (Td,) -> (Td,) long."""
    sentinels = set(int(i) for i in sentinel_ids)
    where = {t: i for i, t in enumerate(inputs.tolist()) if t in sentinels}
    return torch.tensor([where.get(t, -1) for t in targets.tolist()], dtype=torch.long)


def t5_span_corruption(
    ids: torch.Tensor,
    *,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    sentinel_ids: Sequence[int],
    eos_id: int,
    generator: torch.Generator | None = None,
    noise_mask: torch.Tensor | None = None,
    return_alignment: bool = False,
) -> T5Corruption:
    """T5's span-corruption objective for one sequence `ids` (n,) long, without EOS (see the module
    docstring). Inputs: kept tokens with one sentinel per noise span, then EOS; targets: each
    sentinel followed by its span's tokens, then EOS. `noise_mask` (n,) bool replaces the random
    mask (then no generator is needed); T5's own masks always start with kept tokens.
    return_alignment=True also fills `alignment` (`t5_sentinel_alignment`, positions in `inputs`)."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be one sequence (n,), got shape {tuple(ids.shape)}")
    if noise_mask is None:
        if generator is None:
            raise ValueError("t5_span_corruption needs a generator (or a fixed noise_mask)")
        mask = random_spans_noise_mask(len(ids), noise_density, mean_span_length, generator=generator)
    elif noise_mask.shape != ids.shape:
        raise ValueError(f"noise_mask must be (n,) like ids, got {tuple(noise_mask.shape)}")
    else:
        mask = noise_mask.bool()
    eos = torch.tensor([eos_id], dtype=ids.dtype)
    inputs = torch.cat([noise_span_to_unique_sentinel(ids, mask, sentinel_ids), eos])
    targets = torch.cat([noise_span_to_unique_sentinel(ids, ~mask, sentinel_ids), eos])  # T5's nonnoise_span_to_unique_sentinel
    alignment = t5_sentinel_alignment(inputs, targets, sentinel_ids) if return_alignment else None
    return T5Corruption(inputs, targets, mask, alignment)


# --------------------------------------------------------------------------------------- BART


def poisson_span_probs(poisson_lambda: float = 3.0) -> torch.Tensor:
    """fairseq's span-length law: P(k) = e^-lambda lambda^k / k! for k = 0, 1, ... up to and including
    the first k whose P(k) < 1e-7 (not renormalised; torch.multinomial normalises), float32."""
    ps, term = [], math.exp(-poisson_lambda)
    for k in range(128):
        ps.append(term)
        term *= poisson_lambda / (k + 1)
        if ps[-1] < 1e-7:
            break
    return torch.tensor(ps, dtype=torch.float32)


def _budget_lengths(num_to_mask: int, probs: torch.Tensor, generator: torch.Generator) -> list[int]:
    """Span lengths drawn until they reach the budget, the last one cut to meet it exactly."""
    lengths = torch.multinomial(probs, num_to_mask, replacement=True, generator=generator)
    while int(lengths.sum()) < num_to_mask:
        lengths = torch.cat([lengths, torch.multinomial(probs, num_to_mask, replacement=True, generator=generator)])
    cum = lengths.cumsum(0)
    i = int((cum < num_to_mask).sum())  # first index where the cumulative sum reaches the budget
    lengths = lengths[: i + 1].clone()
    lengths[i] = num_to_mask - (int(cum[i - 1]) if i > 0 else 0)
    return lengths.tolist()


def infill_spans(
    ids: torch.Tensor,
    starts: torch.Tensor,
    lengths: torch.Tensor,
    *,
    mask_id: int,
    word_starts: torch.Tensor | None = None,
    random_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace each span by one token (fairseq's replace_length=1); ids (T,), starts and lengths (S,),
    lengths >= 1 in words. A span's start becomes <mask>, or random_ids[s] where that is >= 0
    (random_ids (S,), -1 = mask); its other tokens are deleted. Returns (corrupted ids, covered (T,) bool)."""
    out, covered, _ = _infill(ids, starts, lengths, mask_id=mask_id, word_starts=word_starts, random_ids=random_ids)
    return out, covered


def _infill(ids: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, *, mask_id: int,
            word_starts: torch.Tensor | None, random_ids: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`infill_spans`, also returning keep (T,) bool: the tokens that have a place in the output."""
    T = len(ids)
    is_start = torch.ones(T, dtype=torch.long) if word_starts is None else word_starts.long().clone()
    is_start[0] = 0
    is_start[-1] = 255  # a long "word": no span runs over the last token (fairseq's guard)
    source, keep = ids.clone(), torch.ones(T, dtype=torch.bool)
    covered = torch.zeros(T, dtype=torch.bool)
    source[starts] = mask_id
    covered[starts] = True
    if random_ids is not None:
        use = random_ids >= 0
        source[starts[use]] = random_ids[use].to(ids.dtype)
    index, left = starts.clone(), lengths.clone() - 1
    while index.numel():  # walk every span forward one token at a time, deleting what it covers
        left = left - is_start[index + 1]
        going = left >= 0
        index, left = index[going] + 1, left[going]
        keep[index] = False
        covered[index] = True
    return source[keep], covered, keep


def insert_noise(ids: torch.Tensor, n: int, *, mask_id: int, random_ratio: float, vocab_size: int,
                 generator: torch.Generator) -> torch.Tensor:
    """fairseq's `add_insertion_noise` with n tokens: inserted at distinct positions strictly between
    the first and last token; the first ceil(n random_ratio) of them random ids in [1, vocab_size)."""
    return _insert(ids, n, mask_id=mask_id, random_ratio=random_ratio, vocab_size=vocab_size, generator=generator)[0]


def _insert(ids: torch.Tensor, n: int, *, mask_id: int, random_ratio: float, vocab_size: int,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`insert_noise`, also returning the (T + n,) bool mask of the inserted positions."""
    if n == 0:
        return ids, torch.zeros(len(ids), dtype=torch.bool)
    T = len(ids)
    where = torch.randperm(T + n - 2, generator=generator)[:n] + 1  # positions in the longer sequence
    noise = torch.zeros(T + n, dtype=torch.bool)
    noise[where] = True
    out = torch.full((T + n,), -1, dtype=ids.dtype)
    num_random = math.ceil(n * random_ratio)
    out[where[num_random:]] = mask_id
    out[where[:num_random]] = torch.randint(1, vocab_size, (num_random,), generator=generator, dtype=ids.dtype)
    out[~noise] = ids
    return out, noise


def infilling_alignment(keep: torch.Tensor, covered: torch.Tensor, inserted: torch.Tensor | None = None,
                        order: torch.Tensor | None = None) -> torch.Tensor:
    """Where each target token sits in BART's corrupted input, -1 where it has no copy there.

    keep, covered (T,) bool over the (permuted) sequence, as `infill_spans` leaves them: a token
    survives when it is kept and no span covered it (a span's start stays as <mask> or a random id,
    which is no copy). inserted (T',) bool: the positions `insert_noise` added (they shift the later
    tokens right). order (T,) long: the sentence permutation (`sentence_permutation`; the permuted
    token j is target token order[j]), None for none. Without permutation the alignment is monotonic:
    it walks both sequences, skipping the masked spans and the insertions. Returns (T,) long."""
    pos = keep.long().cumsum(0) - 1  # (T,) position in the infilled sequence
    if inserted is not None:
        pos = (~inserted).nonzero().squeeze(1)[pos.clamp(min=0)]  # (T,) position after the insertions
    permuted = torch.where(keep & ~covered, pos, torch.full_like(pos, -1))
    if order is None:
        return permuted
    out = torch.full_like(permuted, -1)
    out[order] = permuted
    return out


def sentence_permutation(sentence_ends: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Positions (T,) long that put the sentences between the first and last token in a uniformly
    random order (`ids[index]`); sentence_ends (T,) bool marks each sentence's last token (the token
    before the last one always ends a sentence, fairseq's "pretend it ends with a full stop")."""
    T = len(sentence_ends)
    ends = sentence_ends.bool().clone()
    ends[-2] = True
    ends[0] = ends[-1] = False
    bounds = [1] + (ends.nonzero().squeeze(1) + 1).tolist()  # sentence i = bounds[i]:bounds[i+1]
    order = torch.randperm(len(bounds) - 1, generator=generator).tolist()
    return torch.cat([torch.tensor([0])] + [torch.arange(bounds[i], bounds[i + 1]) for i in order]
                     + [torch.tensor([T - 1])])


def bart_text_infilling(
    ids: torch.Tensor,
    *,
    mask_ratio: float = 0.3,
    poisson_lambda: float = 3.0,
    mask_id: int,
    generator: torch.Generator,
    permute_sentences: bool = False,
    sentence_ends: torch.Tensor | None = None,
    random_ratio: float = 0.1,
    vocab_size: int | None = None,
    word_starts: torch.Tensor | None = None,
    return_alignment: bool = False,
) -> BartNoising:
    """BART's text infilling (and optional sentence permutation) of one sequence ids (T,) =
    [<s>, ..., </s>] (see the module docstring). word_starts (T,) bool for whole-word masking (None:
    every token is a word); vocab_size is needed when random_ratio > 0. Targets: ids unchanged.
    return_alignment=True also fills `alignment` (`infilling_alignment`); the draws are the same."""
    if ids.dim() != 1 or len(ids) < 3:
        raise ValueError(f"ids must be one sequence [<s>, ..., </s>] of length >= 3, got shape {tuple(ids.shape)}")
    if not 0.0 <= mask_ratio <= 1.0 or not 0.0 <= random_ratio <= 1.0:
        raise ValueError(f"mask_ratio and random_ratio must be in [0, 1], got {mask_ratio}, {random_ratio}")
    if random_ratio > 0 and vocab_size is None:
        raise ValueError("random_ratio > 0 draws random ids: pass vocab_size")
    source, index = ids, None
    if permute_sentences:
        if sentence_ends is None:
            raise ValueError("permute_sentences=True needs sentence_ends (T,) bool")
        if sentence_ends.shape != ids.shape:
            raise ValueError(f"sentence_ends must be (T,) like ids, got {tuple(sentence_ends.shape)}")
        index = sentence_permutation(sentence_ends, generator)  # (T,)
        source = ids[index]
        word_starts = None if word_starts is None else word_starts[index]  # word starts travel with their tokens
    T = len(source)
    is_start = torch.ones(T, dtype=torch.bool) if word_starts is None else word_starts.bool().clone()
    is_start[0] = is_start[-1] = False
    num_to_mask = math.ceil(int(is_start.sum()) * mask_ratio)
    covered, keep = torch.zeros(T, dtype=torch.bool), torch.ones(T, dtype=torch.bool)
    if num_to_mask == 0:
        alignment = infilling_alignment(keep, covered, None, index) if return_alignment else None
        return BartNoising(source.clone(), ids.clone(), covered, [], alignment)
    span_lengths = _budget_lengths(num_to_mask, poisson_span_probs(poisson_lambda), generator)
    lengths = torch.tensor([n for n in span_lengths if n > 0], dtype=torch.long)
    num_inserts = len(span_lengths) - len(lengths)
    out = source
    if len(lengths):
        candidates = is_start.nonzero().squeeze(1)
        pick = torch.randperm(len(candidates), generator=generator)[: len(lengths)]
        starts = candidates[pick]
        rand = torch.rand(len(starts), generator=generator) < random_ratio
        random_ids = torch.full((len(starts),), -1, dtype=torch.long)
        if rand.any():
            random_ids[rand] = torch.randint(1, vocab_size, (int(rand.sum()),), generator=generator)  # type: ignore[arg-type]
        out, covered, keep = _infill(source, starts, lengths, mask_id=mask_id, word_starts=word_starts,
                                     random_ids=random_ids)
    out, inserted = _insert(out, num_inserts, mask_id=mask_id, random_ratio=random_ratio, vocab_size=vocab_size or 1,
                            generator=generator)
    alignment = infilling_alignment(keep, covered, inserted, index) if return_alignment else None
    return BartNoising(out, ids.clone(), covered, span_lengths, alignment)
