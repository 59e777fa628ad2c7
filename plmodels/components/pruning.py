"""Head pruning and head-mask checks at the model level, shared by every family: `PrunableMixin`.

A model that mixes it in keeps its blocks in `self.blocks`, each with the attention sub-layer at
`block.attn` (a `MultiHeadAttention`, attention.py, which cuts the heads' weights out), and its
config in `self.config` with a `pruned_heads` field {layer: original head ids}. Pruning is recorded
in that field, so a saved checkpoint rebuilds in its pruned shape: the constructor builds the full
model, then `_apply_config_pruning` prunes it to the config's shape (Michel et al. 2019, "Are
Sixteen Heads Really Better than One?"). Which heads to prune is an analysis: probes/pruning.py.

Shared attention weights (ALBERT's cross-layer sharing, encoder.py `share_layers`): layers whose
attention sub-layers hold the same nn.Parameter objects form a group. A head mask still gates a head
in one layer only, but removing a head cuts the one weight tensor that serves the whole group, so
`prune_heads` removes a head only when the request names the same head ids for every layer of its
group, and refuses (ValueError naming the layers and heads) a request that would prune a head in
some of them but not all. `MultiHeadAttention.prune` builds new Parameters, so the group's layers
are tied to its first layer's again afterwards (`tie_parameters`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn


def tie_parameters(source: nn.Module, target: nn.Module) -> None:
    """Point every parameter of `target` at `source`'s parameter of the same name (the same
    nn.Parameter object: one tensor, one gradient); `target` keeps its own modules and hook sites."""
    for name, p in source.named_parameters():
        owner, _, leaf = name.rpartition(".")
        setattr(target.get_submodule(owner), leaf, p)


def shared_attention_groups(blocks: Any) -> list[list[int]]:
    """The layers whose attention sub-layers share their parameters (the same objects), in groups
    of two or more layers, each in increasing order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for l, block in enumerate(blocks):
        groups.setdefault(tuple(id(p) for p in block.attn.parameters()), []).append(l)
    return [g for g in groups.values() if len(g) > 1]


class PrunableMixin:
    """`n_heads_per_layer` and `prune_heads`, shared by every family (needs self.blocks, self.config)."""

    @property
    def n_heads_per_layer(self) -> list[int]:
        return [b.attn.n_heads for b in self.blocks]  # type: ignore[attr-defined]

    def prune_heads(self, heads: dict[int, list[int]]) -> None:
        """Remove heads {layer: [original head ids]} for real; recorded in config.pruned_heads.
        Layers that share attention weights must be asked for the same heads (module docstring)."""
        cfg = self.config  # type: ignore[attr-defined]
        blocks = self.blocks  # type: ignore[attr-defined]
        merged = {k: list(v) for k, v in cfg.pruned_heads.items()}
        asked: dict[int, list[int]] = {}
        for layer, hs in heads.items():
            if not 0 <= layer < len(blocks):
                raise ValueError(f"prune_heads: layer {layer} not in [0, {len(blocks)})")
            asked[layer] = sorted({int(h) for h in hs})
        groups = shared_attention_groups(blocks)
        _check_shared_request(asked, groups)
        for layer, hs in asked.items():
            if hs:
                blocks[layer].attn.prune(hs)
                merged[layer] = sorted(set(merged.get(layer, [])) | set(hs))
        for group in groups:  # each layer cut the same rows into a new Parameter: one tensor again
            for layer in group[1:]:
                tie_parameters(blocks[group[0]].attn, blocks[layer].attn)
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


def _check_shared_request(asked: dict[int, list[int]], groups: list[list[int]]) -> None:
    """Refuse pruning a head in some but not all of the layers that share its weights."""
    for group in groups:
        heads = {layer: asked.get(layer, []) for layer in group}
        every = sorted(set().union(*heads.values()))
        left = {layer: [h for h in every if h not in hs] for layer, hs in heads.items() if hs != every}
        if left:
            raise ValueError(
                f"prune_heads: layers {group} share one set of attention weights (share_layers), so a head is "
                f"removed from all of them or from none; asked to prune {heads} (layer: heads), which leaves "
                f"{left} in place. Prune the same heads in every one of those layers, or gate a head in one "
                "layer with a head_mask instead"
            )
