"""Budgets: the bytes an extraction will need, estimated before it starts, and the refusal.

`extraction` estimates the store's size on disk and one batch's peak RAM from the alignment and
the batch shapes alone, and raises `BudgetError` (with the estimate) before writing anything when
either is over its budget (default: the free disk space and `DEFAULT_MAX_RAM`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.store.store import ATTN_BYTES

DEFAULT_MAX_RAM = 4 * 2**30


class BudgetError(ValueError):
    """An extraction would exceed its disk or memory budget (the message gives the estimate)."""


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
    """Disk = (L+1) N D 2 (float16 vectors) [+ sum_s n_s^2 L H 4 + N L H K 4 (float32 attention)];
    RAM = params + max over batches of (L+1) B T D 4 x 3 (hidden states, their pooled copies, model
    work space) [+ L B H T T 4 x 2]."""
    L1, N = n_layers + 1, int(sent_words.sum())
    disk = L1 * N * d_model * 2
    if attentions:
        disk += int((sent_words.astype(np.int64) ** 2).sum()) * n_layers * n_heads * ATTN_BYTES
        disk += N * n_layers * n_heads * n_special * ATTN_BYTES
    peak = 0
    for B, T in batch_shapes:
        ram = L1 * B * T * d_model * 4 * 3
        if attentions:
            ram += n_layers * B * n_heads * T * T * 4 * 2
        peak = max(peak, ram)
    return Estimate(disk=int(disk), ram=int(param_bytes + peak))
