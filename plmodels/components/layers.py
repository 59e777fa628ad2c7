"""The small layers and the init that the config fields `activation`, `norm`, `bias` and
`layer_norm_eps` build, for every family in the BERT / GPT-2 line.

- `ACTIVATIONS`: the config's activation name -> function (GELU with erf as BERT, GELU with tanh as
  GPT-2, ReLU); also the list of allowed names (model_config.CHOICES).
- `layer_norm(cfg)`: LayerNorm over d_model with the config's epsilon and bias switch.
- `init_weights`: BERT's and GPT-2's init, N(0, 0.02) for every weight matrix and embedding, zero
  biases, LayerNorm gain 1 and bias 0 (a family applies extra scalings itself, as GPT-2's decoder does).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": partial(F.gelu, approximate="tanh"), "relu": F.relu}


def layer_norm(cfg: Any) -> nn.LayerNorm:
    """LayerNorm over cfg.d_model with cfg.layer_norm_eps, biased when cfg.bias."""
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps, bias=cfg.bias)


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT / GPT-2 init: N(0, std) weights, zero biases, LayerNorm gain 1 and bias 0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
