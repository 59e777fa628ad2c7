"""Output dataclasses of the model forward passes (contract: docs/design.md, "Forward").

Forward passes return these dataclasses, never tuples indexed by position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EncoderOutput:
    """What `Encoder.forward` returns.

    last_hidden_state: (B, T, D) output of the last block (after the final LayerNorm for pre-LN).
    pooler_output: (B, D) tanh(W h_[CLS] + b), BERT's pooler, or None.
    hidden_states: L+1 tensors (B, T, D) (embedding output, then each block's output) or None.
    attentions: L tensors (B, H_l, T, T) of post-softmax probabilities (head mask applied) or None.
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class DecoderOutput:
    """What `Decoder.forward` returns.

    last_hidden_state: (B, T, D) after the final LayerNorm (pre-LN).
    logits: (B, T, V) next-token logits, or None when `return_logits=False`.
    hidden_states: L+1 tensors (B, T, D) or None.  attentions: L tensors (B, H_l, T, T) or None.
    """

    last_hidden_state: torch.Tensor
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
