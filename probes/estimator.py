"""What the per-sentence probes (`probes.arcs`, `probes.structural`) share as scikit-learn shaped
estimators: parameters listed in `_PARAMS` (get_params / set_params, an unknown name refused), and
the one-layer input check of `fit` / `predict`, and the per-layer access of their data classes."""
from __future__ import annotations

from typing import Any

import numpy as np

from probes.edge import as_layers


class OneLayerEstimator:
    """Mixin: `_PARAMS` names the constructor's parameters; `_layer(X)` accepts one layer (N_words, D)
    (or a 1-element list, memmaps welcome) of the width the probe was fitted on."""

    _PARAMS: tuple[str, ...] = ()

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._PARAMS}

    def set_params(self, **params: Any):
        for k, v in params.items():
            if k not in self._PARAMS:
                raise ValueError(f"{type(self).__name__}: unknown parameter {k!r}")
            setattr(self, k, v)
        return self

    def _layer(self, X: Any) -> np.ndarray:
        layers = as_layers(X)
        if len(layers) != 1:
            raise ValueError(f"X: {type(self).__name__} takes one layer (N_words, D), got {len(layers)} layers")
        if hasattr(self, "d_in_") and layers[0].shape[1] != self.d_in_:
            raise ValueError(f"X: width {layers[0].shape[1]}, but the probe was fitted on width {self.d_in_}")
        return layers[0]


class LayeredData:
    """Mixin for a split's data class with X per layer ((L+1, N_words, D) array or list of memmaps)."""

    X: Any

    @property
    def n_layers(self) -> int:
        return len(as_layers(self.X))

    def layer(self, l: int) -> np.ndarray:
        layers = as_layers(self.X)
        if not 0 <= l < len(layers):
            raise ValueError(f"layers: layer {l} out of range, the data has {len(layers)} layers")
        return layers[l]
