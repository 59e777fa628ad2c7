"""XLNet's permutation language-modelling batch: factorisation order, perm_mask, target_mapping.

Yang et al. 2019, "XLNet" (Sec. 2.2-2.3): sample a factorisation order z of the positions and
predict x_{z_t} from x_{z<t}; with partial prediction (Sec. 2.3, Eq. 5) only the last 1/K of the
order are targets (K = 6 for XLNet-Large, 7 for Base). The model sees the order only through masks:
`perm_mask[b, i, j] = 1` means i may not see j (xlnet.py; its content stream also always sees
itself), and `target_mapping` (B, P, T) picks the P targets the query stream predicts.

The mask is the rule of the authors' `_local_perm` (zihangdai/xlnet, data_utils.py), which HF's
XLNetLMHeadModel expects: with rev(i) = the rank of i in the order for a target and -1 for a
non-target, and self_rev(i) = rev(i) for a target and rev(i) + 1 for a non-target,
    perm_mask[i, j] = [self_rev(i) <= rev(j)] and j is a target.
So a target sees every non-target and the targets earlier in the order, not itself (the query
stream; the content stream adds itself); a non-target sees all non-targets, in either direction,
and no target. The non-targets are a bidirectional context, not a left-to-right prefix: their order
is never used, and their query stream is never computed.

Differences from the authors' pipeline: the targets are the last n_predict of a uniform random
order (the paper's partial prediction; the authors' code instead picks the targets as n-gram spans,
`_sample_mask`, and puts them last), no `perm_size` blocks and no `bi_data` batch halves. Tokens
outside `predictable` (the training objective passes the row's [CLS] / [SEP]) play the authors'
functional tokens: never targets, always context (in `_local_perm` they also take part in the
order; here they come before every target, which the masks cannot tell apart). `target_mapping`'s rows are the targets in position order, zero rows
(label -100) padding a row with fewer targets, as the authors pad to num_predict; with `n_slots`
(a compiled run) every batch of a row length has the same P, `prediction_slots`. Labels are the
input tokens at the targets (the authors' `new_targets` shift undoes their next-token targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PermutationBatch:
    """perm_mask (B, T, T) float, 1 = i may not see j; target_mapping (B, P, T) float one-hot rows
    (zero rows: padding); labels (B, P) token ids, -100 at padding rows; order (B, T), order[b, r] =
    the position at rank r."""

    perm_mask: torch.Tensor
    target_mapping: torch.Tensor
    labels: torch.Tensor
    order: torch.Tensor


def prediction_slots(seq_len: int, partial_k: int) -> int:
    """The most targets a row of `seq_len` tokens predicts with partial_k = K: max(T // K, 1), as
    n = min(max(n_real // K, 1), n_real) with n_real <= T. The P of a compiled run's batches
    (`permutation_batch(n_slots=...)`): the same for every batch of a row length, whatever the
    rows' [PAD] and special tokens leave predictable. At 128-token rows [CLS] body [SEP] it is the
    count of a row without a document break (126 // K = 128 // K for K = 6 and 7): it pads only a
    batch whose every row holds a break."""
    if seq_len < 1 or partial_k < 1:
        raise ValueError(f"seq_len and partial_k must be >= 1, got {seq_len}, {partial_k}")
    return max(seq_len // partial_k, 1)


def permutation_batch(
    ids: torch.Tensor,
    *,
    n_predict: int | None = None,
    partial_k: int | None = None,
    attention_mask: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    predictable: torch.Tensor | None = None,
    n_slots: int | None = None,
) -> PermutationBatch:
    """ids (B, T) -> the masks of a random factorisation order per row (or the given `order`, (T,)
    or (B, T) positions, first to last). Targets: the last `n_predict` of each row's order, or the
    last n_real // partial_k (at least 1) with partial_k = K. With `attention_mask` (B, T) the padding
    comes first in the order (never a target; the model's attention_mask hides it anyway).
    `predictable` (B, T) bool: the real tokens that may be targets (default: all); the others come
    after the padding and before them in a drawn order, and a given order must end in them; n_real
    above then counts the predictable tokens. `n_slots`: P, the rows of target_mapping and labels; None
    = the batch's largest target count, an int at least that count pads every batch to the same P
    (`prediction_slots`: a compiled step's static shape; a count over it is a ValueError)."""
    if (n_predict is None) == (partial_k is None):
        raise ValueError("give exactly one of n_predict and partial_k")
    B, T = ids.shape
    dev = ids.device
    real = torch.ones(B, T, dtype=torch.bool, device=dev) if attention_mask is None else attention_mask.bool()
    cand = real if predictable is None else real & predictable.to(dev).bool()  # (B, T): may be a target
    n_real = cand.sum(1)  # (B,)
    if order is None:
        keys = torch.rand(B, T, generator=generator, device=generator.device if generator else dev).to(dev)
        keys = torch.where(real, keys, -2.0)
        order = torch.where(cand | ~real, keys, -1.0).argsort(1)  # padding, other real tokens, candidates shuffled
    else:
        order = order.to(dev).expand(B, T)
        if not torch.equal(order.sort(1).values, torch.arange(T, device=dev).expand(B, T)):
            raise ValueError("order must be a permutation of 0..T-1 in every row")
    rank = order.argsort(1)  # (B, T): rank[b, i] = where position i comes in the order
    if partial_k is not None:
        if partial_k < 1:
            raise ValueError(f"partial_k must be >= 1, got {partial_k}")
        n = torch.minimum((n_real // partial_k).clamp(min=1), n_real)  # a row with none predicts none
    else:
        if not 1 <= n_predict <= T:
            raise ValueError(f"n_predict must be in [1, T={T}], got {n_predict}")
        n = torch.minimum(torch.full_like(n_real, n_predict), n_real)
    target = (rank >= T - n[:, None]) & real  # (B, T): the last n of the order
    if predictable is not None and (target & ~cand).any():
        raise ValueError("the order's last tokens (the targets) must be predictable")

    # the authors' _local_perm rule (module docstring)
    rev = torch.where(target, rank, -1)  # (B, T)
    self_rev = torch.where(target, rev, rev + 1)
    perm_mask = (self_rev[:, :, None] <= rev[:, None, :]) & target[:, None, :]  # (B, T, T)

    P = int(n.max())
    if n_slots is not None:
        if not P <= n_slots <= T:
            raise ValueError(f"n_slots={n_slots} must be in [{P}, T={T}]: a row predicts {P} targets")
        P = n_slots
    pos = (~target).long().sort(dim=1, stable=True).indices[:, :P]  # (B, P): targets first, in position order
    valid = torch.arange(P, device=dev)[None] < n[:, None]  # (B, P)
    target_mapping = torch.nn.functional.one_hot(pos, T).float() * valid[..., None]
    labels = ids.gather(1, pos).masked_fill(~valid, -100)
    return PermutationBatch(perm_mask.float(), target_mapping, labels, order)
