"""A tiny encoder with one planted crucial head (CRUCIAL) and batches labelled with its own
predictions: the known answer the head-importance and pruning tests recover (Michel et al. 2019's
scores must rank the planted head first)."""
from __future__ import annotations

import torch

from plmodels.components.layers import init_weights
from plmodels.encoder import Encoder, EncoderConfig

N_LAYERS, N_HEADS, D_MODEL, VOCAB = 2, 4, 32, 40
HEAD_DIM = D_MODEL // N_HEADS
CRUCIAL = (1, 2)


def tiny_config(**overrides) -> EncoderConfig:
    fields = dict(vocab_size=VOCAB, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS, d_ff=64,
                  max_positions=16, dropout=0.0)
    return EncoderConfig(**{**fields, **overrides})


def planted_encoder(seed: int = 0, **overrides) -> Encoder:
    """A tiny encoder where head CRUCIAL matters and the others barely do.

    Weights are drawn with std 0.2 (so attention changes predictions at all), every head's output
    projection columns are scaled by 0.1, then the crucial head's by 20 (net x2) and its query rows
    by 4 (a sharp, confident pattern).
    """
    torch.manual_seed(seed)
    model = Encoder(tiny_config(**overrides))
    model.apply(lambda m: init_weights(m, std=0.2))
    layer, head = CRUCIAL
    cols = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.out.weight.mul_(0.1)
        model.blocks[layer].attn.out.weight[:, cols] *= 20.0
        model.blocks[layer].attn.qkv.weight[cols] *= 4.0  # query rows come first in the fused QKV
    return model.eval()


def self_labelled_batches(model, n_batches: int = 3, seed: int = 1) -> list[dict]:
    """Batches labelled with the full model's own argmax predictions at every real position, so
    that removing a head that matters can only hurt; one row is padded."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        ids = torch.randint(5, VOCAB, (4, 10), generator=g)
        mask = torch.ones(4, 10, dtype=torch.long)
        mask[0, 7:] = 0
        with torch.no_grad():
            hidden = model(ids, attention_mask=mask).last_hidden_state
            labels = model.mlm_logits(hidden).argmax(-1)
        labels[mask == 0] = -100
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches
