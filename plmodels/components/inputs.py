"""Checks and preparations of a forward pass's inputs that every family shares.

- `check_length`: a sequence longer than the config's `max_positions` is an error that says how to
  cut it (a learned position table has no row for it; RoPE and ALiBi models keep the same limit).
- `packing_for`: the `Packing` (attention.py) of a padded batch for `unpad=True`, which runs the
  position-wise layers on the real tokens only (Geiping & Goldstein 2022, "Cramming"), after
  refusing hooks that would see packed tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from .attention import Packing


def check_length(seq_len: int, max_positions: int) -> None:
    if seq_len > max_positions:
        raise ValueError(
            f"sequence length {seq_len} exceeds max_positions={max_positions}; truncate the input to at "
            f"most {max_positions} tokens (e.g. input_ids[:, :{max_positions}] and the same for "
            "attention_mask), or split long texts into windows"
        )


def packing_for(model: Any, attention_mask: torch.Tensor | None, unpad: bool) -> Packing | None:
    """The `Packing` of a padded batch when unpad=True and there is padding, else None. Hooks on the
    residual-stream sites of a block would see (N, D) tensors instead of (B, T, D), so unpadding
    refuses them (the attention sites `pattern` and `head_out` keep their padded shapes)."""
    if not unpad or attention_mask is None or bool(attention_mask.all()):
        return None
    packed_sites = ("resid_pre", "attn_out", "mlp_out", "resid_post")
    active = [name for name, p in model.hook_points().items() if p.fns and name.endswith(packed_sites)]
    if active:
        raise ValueError(f"unpad=True cannot run with hooks on {active} (they would see packed (N, D) "
                         "tensors); use unpad=False")
    return Packing(attention_mask)
