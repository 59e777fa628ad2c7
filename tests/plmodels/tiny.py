"""Tiny model configs shared by the plmodels tests (seconds on a shared CPU): a seeded encoder and
decoder of the TINY shape, and a random padded batch for them."""

from __future__ import annotations

import torch

from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig

TINY = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_positions=16)


def tiny_encoder(**overrides) -> Encoder:
    torch.manual_seed(0)
    return Encoder(EncoderConfig(**{**TINY, **overrides})).eval()


def tiny_decoder(**overrides) -> Decoder:
    torch.manual_seed(0)
    return Decoder(DecoderConfig(**{**TINY, **overrides})).eval()


def batch(B: int = 3, T: int = 9, vocab: int = 61, pad_from: int | None = 6):
    """Random ids (B, T) and an attention mask whose last row is padded from `pad_from` on."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if pad_from is not None:
        mask[-1, pad_from:] = 0
        ids[-1, pad_from:] = 0
    return ids, mask
