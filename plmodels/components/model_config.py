"""What every model family's config shares: the common fields' checks and the JSON round trip.

A family's config is a frozen dataclass of primitives (`EncoderConfig` in encoder.py, `DecoderConfig`
in decoder.py) that subclasses `plmodels.config.Config`; its `__post_init__` calls
`check_shared_fields` and adds its own checks, `to_dict` is Config's (JSON-ready: pruned_heads'
keys as strings) and `from_dict` is `config_from_dict`: that pair is the `config` object of a
checkpoint's config.json (checkpoint.py), so it stays byte-stable.
"""

from __future__ import annotations

from typing import Any

from plmodels.config import build

from .layers import ACTIVATIONS

CHOICES = {
    "position": ("learned", "rope", "alibi"),
    "norm": ("post", "pre"),
    "activation": tuple(ACTIVATIONS),
    "mlp": ("plain", "gated"),
}


def check_shared_fields(cfg: Any) -> None:
    """The checks every model config shares; each ValueError names its field."""
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_positions"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(cfg).__name__}.{name} must be an int >= 1, got {value!r}")
    if cfg.d_model % cfg.n_heads:
        raise ValueError(f"{type(cfg).__name__}.n_heads={cfg.n_heads} must divide d_model={cfg.d_model}")
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"{type(cfg).__name__}.{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    if cfg.position == "rope" and (cfg.d_model // cfg.n_heads) % 2:
        raise ValueError(f"{type(cfg).__name__}.position='rope' needs an even head dim, got {cfg.d_model // cfg.n_heads}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"{type(cfg).__name__}.dropout must be in [0, 1), got {cfg.dropout!r}")
    if not cfg.layer_norm_eps > 0:
        raise ValueError(f"{type(cfg).__name__}.layer_norm_eps must be > 0, got {cfg.layer_norm_eps!r}")
    for layer, heads in cfg.pruned_heads.items():
        if not (isinstance(layer, int) and 0 <= layer < cfg.n_layers):
            raise ValueError(f"{type(cfg).__name__}.pruned_heads: layer {layer!r} not in [0, {cfg.n_layers})")
        if any(not (isinstance(h, int) and 0 <= h < cfg.n_heads) for h in heads) or len(set(heads)) != len(heads):
            raise ValueError(f"{type(cfg).__name__}.pruned_heads[{layer}]={heads!r}: need distinct ids in [0, {cfg.n_heads})")


def config_from_dict(cls: type, d: dict, source: str | None = None) -> Any:
    """Build a model config from a dict (e.g. a checkpoint's config.json) with the typed loader
    (`plmodels.config.build`): unknown keys and wrong types are errors naming `source` and the field.
    Pruned head ids are kept sorted."""
    d = dict(d)
    heads = d.get("pruned_heads")
    if isinstance(heads, dict):
        d["pruned_heads"] = {k: sorted(v) if isinstance(v, list) and all(isinstance(h, int) for h in v) else v
                             for k, v in heads.items()}
    return build(cls, d, source)
