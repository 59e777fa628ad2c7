"""ELMo-style scalar mix of K layers (Peters et al. 2018, "Deep contextualized word representations").

    mix(h_0 .. h_{K-1}) = gamma * sum_k s_k h_k,   s = softmax(w)

with K free logits w (initialised to 0, so the mix starts as the plain average) and one scalar
gamma (initialised to 1). Tenney et al. (2019b) read the learned s_k as "which layers the probe
used"; `probes.layers.expected_layer` turns them into E_s = sum_k k s_k.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class ScalarMix(nn.Module):
    """Learned softmax-weighted sum over a layer axis.

    forward(x): x is (..., K, D) -> (..., D).
    """

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"ScalarMix: n_layers must be >= 1, got {n_layers}")
        self.n_layers = n_layers
        self.logits = nn.Parameter(torch.zeros(n_layers))  # w, (K,)
        self.gamma = nn.Parameter(torch.ones(()))          # scalar

    def weights(self) -> torch.Tensor:
        """s = softmax(w), shape (K,)."""
        return torch.softmax(self.logits, dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] != self.n_layers:
            raise ValueError(f"ScalarMix: expected {self.n_layers} layers on axis -2, got shape {tuple(x.shape)}")
        s = self.weights().to(x.dtype)
        return self.gamma * torch.einsum("...kd,k->...d", x, s)  # (..., D)

    def numpy_weights(self) -> np.ndarray:
        """The mixing weights s as a float64 numpy array (K,)."""
        return self.weights().detach().cpu().double().numpy()
