"""Head pruning and head-mask checks at the model level, shared by every family: `PrunableMixin`.

A model that mixes it in keeps its blocks in `self.blocks`, each with the attention sub-layer at
`block.attn` (a `MultiHeadAttention`, attention.py, which cuts the heads' weights out), and its
config in `self.config` with a `pruned_heads` field {layer: original head ids}. Pruning is recorded
in that field, so a saved checkpoint rebuilds in its pruned shape: the constructor builds the full
model, then `_apply_config_pruning` prunes it to the config's shape (Michel et al. 2019, "Are
Sixteen Heads Really Better than One?"). Which heads to prune is an analysis: probes/pruning.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


class PrunableMixin:
    """`n_heads_per_layer` and `prune_heads`, shared by every family (needs self.blocks, self.config)."""

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [b.attn.n_heads for b in self.blocks]  # type: ignore[attr-defined]

    def prune_heads(self, heads: dict[int, list[int]]) -> None:
        """Remove heads {layer: [original head ids]} for real; recorded in config.pruned_heads."""
        cfg = self.config  # type: ignore[attr-defined]
        merged = {k: list(v) for k, v in cfg.pruned_heads.items()}
        for layer, hs in heads.items():
            if not 0 <= layer < len(self.blocks):  # type: ignore[attr-defined]
                raise ValueError(f"prune_heads: layer {layer} not in [0, {len(self.blocks)})")  # type: ignore[attr-defined]
            hs = sorted(set(int(h) for h in hs))
            if hs:
                self.blocks[layer].attn.prune(hs)  # type: ignore[attr-defined]
                merged[layer] = sorted(set(merged.get(layer, [])) | set(hs))
        self.config = dataclasses.replace(cfg, pruned_heads=dict(sorted(merged.items())))

    def _apply_config_pruning(self, cfg: Any) -> None:
        """Called by constructors: build full size, then prune to the config's shape."""
        self.config = dataclasses.replace(cfg, pruned_heads={})
        self.prune_heads(cfg.pruned_heads)

    def _check_head_mask(self, head_mask: torch.Tensor | None) -> None:
        cfg = self.config  # type: ignore[attr-defined]
        if head_mask is not None and tuple(head_mask.shape) != (cfg.n_layers, cfg.n_heads):
            raise ValueError(
                f"head_mask must have shape (n_layers, n_heads)=({cfg.n_layers}, {cfg.n_heads}) indexed by "
                f"original head ids, got {tuple(head_mask.shape)}"
            )
