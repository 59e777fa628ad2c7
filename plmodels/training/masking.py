"""Training targets for language-model pretraining: masked LM, next-sentence pairs, causal LM.

Masked language modelling follows BERT (Devlin et al., 2019, Sec. 3.1 and Appendix A.1): a fraction
`rate` (0.15) of the non-special tokens is selected for prediction; of those, 80% are replaced by
[MASK], 10% by a random (non-special) token and 10% are left unchanged. Labels hold the original id
at selected positions and -100 (ignored by `cross_entropy`) elsewhere.

Masking is *dynamic* as in RoBERTa (Liu et al., 2019, Sec. 4.1): a new mask is drawn every time a
sequence is seen, inside the training step, from a `torch.Generator` seeded by (seed, step), so a
resumed run draws exactly the masks the uninterrupted run would have drawn.

Whole-word masking (the BERT authors' 2019 update) selects whole words: a WordPiece token whose
text starts with "##" continues the previous word, and a word is selected with probability `rate`,
taking all its pieces with it (the 80/10/10 choice is still made per token, as in BERT's
`create_pretraining_data.py`).

Masking-ratio decay (Yang et al. 2023, "Learning Better Masking for Better Language Model
Pre-training", ACL) is an option: with `rate_final` set, the selection rate falls linearly from
`rate` to `rate_final` over the run (the trainer passes the lr schedule's position), so a model
gets the denser signal of a high rate early and ends on the rate it is evaluated at.

Next-sentence prediction (BERT Sec. 3.1, off by default as in RoBERTa) builds
`[CLS] A [SEP] B [SEP]` where B is the true continuation of A half the time (label 0, "IsNext") and
a segment from another sequence otherwise (label 1, "NotNext"); token_type_ids are 0 on A and 1 on B.
Sentence-order prediction (ALBERT, Lan et al. 2020, Sec. 4.1) keeps both segments from the same text
and swaps their order half the time: `[CLS] B [SEP] A [SEP]` is label 1, the text's order label 0,
so topic cues cannot solve it. Both tasks use the same 2-way head on the pooled [CLS].

The causal-LM target (Radford et al., 2019) is the input shifted by one: labels[t] = input[t+1].

Static shapes (issue 81): a masked-LM step reads its predicted positions through `MaskedSlots`, a
fixed-size gather with -100 at the padding slots, as BERT's own TPU input pipeline pads
masked_lm_positions / masked_lm_weights to max_predictions_per_seq (Devlin et al. 2019,
create_pretraining_data.py). The slots are built on the host with the batch, so the step neither
selects with a boolean mask (a device-to-host sync on CUDA) nor reads a count back. Their sizes are
the batch's own counts (`masked_slots(labels)`), or bounds that depend only on the config
(`slot_sizes`: mean + 6 standard deviations of the selected count, per row and per batch), which a
compiled step needs to compile once; a mask over a bound (odds below 1e-9 a batch at the defaults)
loses its last selections (`cap_predictions`), never silently at the loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch

from plmodels.config import Config

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingConfig(Config):
    """How MLM targets are drawn (all fractions in [0, 1])."""

    rate: float = 0.15          # share of non-special tokens selected for prediction
    mask_frac: float = 0.8      # of the selected: replaced by [MASK]
    random_frac: float = 0.1    # of the selected: replaced by a random non-special token
    whole_word: bool = False    # select whole words (needs WordPiece "##" continuation ids)
    nsp: bool = False           # next-sentence prediction pairs (BERT); off as in RoBERTa
    sop: bool = False           # sentence-order prediction pairs (ALBERT; excludes nsp)
    rate_final: float | None = None  # masking-ratio decay: `rate` falls linearly to this over the run
                                # (Yang et al. 2023, "Learning Better Masking for Better Language
                                # Model Pre-training"); None = `rate` throughout

    def rate_at(self, progress: float) -> float:
        """The selection rate at training progress in [0, 1] (the lr schedule's position)."""
        if self.rate_final is None:
            return self.rate
        p = min(1.0, max(0.0, progress))
        return self.rate + (self.rate_final - self.rate) * p

    def __post_init__(self) -> None:
        for name in ("rate", "mask_frac", "random_frac"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"MaskingConfig.{name} must be in [0, 1], got {v}")
        if self.rate == 0.0:
            raise ValueError("MaskingConfig.rate must be > 0 (nothing would be predicted)")
        if self.rate_final is not None and not 0.0 < self.rate_final <= 1.0:
            raise ValueError(f"MaskingConfig.rate_final must be in (0, 1] or null, got {self.rate_final}")
        if self.nsp and self.sop:
            raise ValueError("MaskingConfig.nsp and sop exclude each other (one sentence-pair task per run)")
        if self.mask_frac + self.random_frac > 1.0 + 1e-9:
            raise ValueError(
                f"MaskingConfig.mask_frac + random_frac must be <= 1, got {self.mask_frac} + {self.random_frac}"
            )


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator seeded from (seed, step, stream) so each step's randomness is reproducible.

    The three integers are mixed with distinct large odd multipliers (a cheap hash) so that
    neighbouring (seed, step) pairs do not give overlapping streams.
    """
    g = torch.Generator(device="cpu")
    mixed = (seed * 0x9E3779B1 + step * 0x85EBCA77 + stream * 0xC2B2AE3D + 0x27D4EB2F) % (2**63 - 1)
    g.manual_seed(mixed)
    return g


def special_mask(input_ids: torch.Tensor, special_ids: Iterable[int]) -> torch.Tensor:
    """(B, T) bool: True where the token is one of `special_ids` (never masked, never a target)."""
    ids = torch.tensor(sorted(set(int(i) for i in special_ids)), dtype=input_ids.dtype)
    return torch.isin(input_ids, ids)


def continuation_ids(vocab: dict[str, int]) -> torch.Tensor:
    """Sorted ids of WordPiece continuation pieces (text starting with "##") from a token->id map."""
    return torch.tensor(sorted(i for t, i in vocab.items() if t.startswith("##")), dtype=torch.long)


def word_starts(input_ids: torch.Tensor, cont_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True where a token starts a word (i.e. is not a "##" continuation piece)."""
    return ~torch.isin(input_ids, cont_ids)


def mask_tokens(
    input_ids: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    generator: torch.Generator,
    cfg: MaskingConfig = MaskingConfig(),
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's MLM corruption of a batch.

    input_ids: (B, T) long. starts: (B, T) bool word starts, required when cfg.whole_word.
    Returns (corrupted ids (B, T), labels (B, T) with original ids at selected positions, -100
    elsewhere). Special tokens (padding, [CLS], [SEP], ...) are never selected, and random
    replacements are drawn uniformly from the non-special ids.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    specials = sorted(set(int(i) for i in special_ids))
    is_special = special_mask(input_ids, specials)
    u = torch.rand(input_ids.shape, generator=generator)
    if cfg.whole_word:
        if starts is None:
            raise ValueError("whole-word masking needs `starts` (word starts from continuation ids)")
        # Each token reads the draw of its word's first piece: index of the last start at or before t.
        T = input_ids.shape[1]
        pos = torch.arange(T).expand_as(input_ids)
        start_pos = torch.where(starts | is_special, pos, torch.zeros_like(pos)).cummax(dim=1).values
        u = u.gather(1, start_pos)
    selected = (u < cfg.rate) & ~is_special

    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator)
    to_mask = selected & (action < cfg.mask_frac)
    to_random = selected & (action >= cfg.mask_frac) & (action < cfg.mask_frac + cfg.random_frac)

    allowed = torch.tensor([i for i in range(vocab_size) if i not in set(specials)], dtype=input_ids.dtype)
    rand_idx = torch.randint(len(allowed), input_ids.shape, generator=generator)
    corrupted = input_ids.clone()
    corrupted[to_mask] = mask_id
    corrupted[to_random] = allowed[rand_idx[to_random]]
    return corrupted, labels


def nsp_pairs(
    content: torch.Tensor,
    *,
    cls_id: int,
    sep_id: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-sentence-prediction inputs from rows of running text (BERT Sec. 3.1).

    content: (B, T-3) token ids without specials, each row a contiguous stretch of text. Each row is
    cut at a random point c in [1, T-4]: A = row[:c]; B = row[c:] (label 0, IsNext) or, with
    probability 1/2, the same span from another row (label 1, NotNext; rows are paired by a random
    derangement, so the other row is never the row itself). Needs B >= 2.
    Returns input_ids (B, T) = [CLS] A [SEP] B [SEP], token_type_ids (B, T), nsp_labels (B,).
    """
    Bn, L = content.shape
    if Bn < 2 or L < 2:
        raise ValueError(f"nsp_pairs needs at least 2 rows of at least 2 tokens, got {tuple(content.shape)}")
    cuts = torch.randint(1, L, (Bn,), generator=generator)
    is_random = torch.rand(Bn, generator=generator) < 0.5
    shift = torch.randint(1, Bn, (1,), generator=generator).item()
    other = torch.roll(torch.arange(Bn), shifts=int(shift))  # a derangement: other[i] != i
    ids = torch.empty((Bn, L + 3), dtype=content.dtype)
    types = torch.zeros((Bn, L + 3), dtype=torch.long)
    for i in range(Bn):
        c = int(cuts[i])
        src = content[other[i]] if is_random[i] else content[i]
        ids[i] = torch.cat([
            torch.tensor([cls_id]), content[i, :c], torch.tensor([sep_id]), src[c:], torch.tensor([sep_id]),
        ])
        types[i, c + 2:] = 1
    return ids, types, is_random.long()


def causal_lm_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token targets: labels[:, t] = input_ids[:, t+1]; the last position and padding get -100.

    input_ids, attention_mask: (B, T). Returns (B, T) long, aligned with the model's logits.
    """
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = input_ids[:, 1:]
    if attention_mask is not None:
        labels[:, :-1][attention_mask[:, 1:] == 0] = IGNORE_INDEX
    return labels


def sop_pairs(
    content: torch.Tensor,
    *,
    cls_id: int,
    sep_id: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sentence-order-prediction inputs from rows of running text (ALBERT, Lan et al. 2020, Sec. 4.2).

    content: (B, T-3) token ids without specials, each row a contiguous stretch of text, B >= 1.
    Each row is cut at a random point c in [1, T-4] into two consecutive segments A = row[:c],
    B = row[c:], as in `nsp_pairs`. Positives keep the order, [CLS] A [SEP] B [SEP] (label 0);
    with probability 1/2 the same segments are swapped, [CLS] B [SEP] A [SEP] (label 1). Unlike NSP
    both classes share topic and text, so only coherence tells them apart.
    Returns input_ids (B, T), token_type_ids (B, T): 0 on [CLS], the first segment and its [SEP],
    1 after it; sop_labels (B,).
    """
    Bn, L = content.shape
    if Bn < 1 or L < 2:
        raise ValueError(f"sop_pairs needs at least 1 row of at least 2 tokens, got {tuple(content.shape)}")
    cuts = torch.randint(1, L, (Bn,), generator=generator)
    swapped = torch.rand(Bn, generator=generator) < 0.5
    ids = torch.empty((Bn, L + 3), dtype=content.dtype)
    types = torch.zeros((Bn, L + 3), dtype=torch.long)
    cls, sep = torch.tensor([cls_id], dtype=content.dtype), torch.tensor([sep_id], dtype=content.dtype)
    for i in range(Bn):
        c = int(cuts[i])
        first, second = (content[i, c:], content[i, :c]) if swapped[i] else (content[i, :c], content[i, c:])
        ids[i] = torch.cat([cls, first, sep, second, sep])
        types[i, len(first) + 2:] = 1
    return ids, types, swapped.long()


# standard deviations above the mean selected count at which `slot_sizes` puts its bounds
SLOT_SIGMAS = 6.0


@dataclass
class MaskedSlots:
    """A masked-LM batch's predicted positions in shapes set by two sizes, Q slots a row and M a batch.

    index: (B, Q) long, each row's labelled positions in increasing order, then its other positions
        (padding slots; Q <= T). rows: (M,) long, indices into the B*Q slots, the labelled ones first
        in row-major order (the order of labels[labels != -100]), then padding slots.
    positions: (M,) long, the same slots as flat positions b * T + t. targets: (M,) long, the labels
        there (-100 at a padding slot, which is an unlabelled position). count: () float32, the number of
        labelled positions. All built on the host, moved with the batch (`data.batch_to`).
    """

    index: torch.Tensor
    rows: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    count: torch.Tensor

    def to(self, device: torch.device, pin: bool = False) -> "MaskedSlots":
        mv = lambda t: (t.pin_memory() if pin else t).to(device, non_blocking=True)  # noqa: E731
        return MaskedSlots(mv(self.index), mv(self.rows), mv(self.positions), mv(self.targets), mv(self.count))


def slot_sizes(batch_size: int, seq_len: int, rate: float, sigmas: float = SLOT_SIGMAS) -> tuple[int, int]:
    """(Q, M): slots per row and per batch that hold a selection at `rate` of (batch_size, seq_len)
    tokens but with odds of a normal tail past `sigmas` standard deviations (binomial counts: per row
    T p + s sqrt(T p (1 - p)), per batch the same over B T tokens), rounded up to a multiple of 8."""
    def bound(n: int) -> int:
        return min(n, 8 * math.ceil((n * rate + sigmas * math.sqrt(n * rate * (1 - rate))) / 8))
    q = bound(seq_len)
    return q, min(batch_size * q, bound(batch_size * seq_len))


def cap_predictions(ids: torch.Tensor, labels: torch.Tensor, original: torch.Tensor,
                    sizes: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels) with at most Q labelled positions a row and M a batch (sizes = (Q, M)): the
    selections past the Q-th of a row, then past the M-th of the batch in row-major order, get their
    original token back and label -100. All (B, T); a batch within the bounds is returned as it is."""
    q, m = sizes
    sel = labels != IGNORE_INDEX
    keep = sel & (sel.cumsum(1) <= q)
    keep &= keep.flatten().cumsum(0).view_as(keep) <= m
    if torch.equal(keep, sel):
        return ids, labels
    drop = sel & ~keep
    return torch.where(drop, original, ids), torch.where(drop, torch.full_like(labels, IGNORE_INDEX), labels)


def masked_slots(labels: torch.Tensor, sizes: tuple[int, int] | None = None) -> MaskedSlots:
    """The `MaskedSlots` of labels (B, T) with sizes (Q, M), or the batch's own (its largest row count,
    its total) when None. A row or batch over the sizes is an error (`cap_predictions` first). Reads
    the counts on the host: call it where the batch is built."""
    B, T = labels.shape
    sel = labels != IGNORE_INDEX
    counts = sel.sum(1)  # (B,)
    most, total = (int(counts.max()) if B else 0), int(counts.sum())
    q, m = (most, total) if sizes is None else sizes
    if most > q or total > m:
        raise ValueError(f"masked_slots: {most} labels in a row and {total} in the batch, over the sizes {(q, m)}")
    index = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)[:, :q]  # (B, Q)
    valid = torch.arange(q, device=labels.device)[None, :] < counts[:, None]  # (B, Q)
    rows = torch.argsort((~valid.flatten()).to(torch.int8), stable=True)[:m]  # (M,)
    positions = (index + torch.arange(B, device=labels.device)[:, None] * T).flatten()[rows]  # (M,)
    return MaskedSlots(index, rows, positions, labels.flatten()[positions],
                       torch.tensor(float(total), dtype=torch.float32, device=labels.device))
