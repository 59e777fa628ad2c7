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
"""
from __future__ import annotations

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
