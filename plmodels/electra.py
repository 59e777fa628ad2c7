"""ELECTRA (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
Generators"): a small masked-LM generator fills the masked positions with its own samples, and the
discriminator, the model the analyses read, tells for every token whether it was replaced.

Reading order: config -> the generator's shape -> the pair (shared embeddings) -> the loss.

Following the authors' code (google-research/electra, `run_pretraining.py`, `pretrain_helpers.py`,
`model/modeling.py`):
- The generator is a BERT encoder of the discriminator's depth at a fraction of its width
  (`generator_frac`, 1/4 by default: hidden, heads and FFN scaled), with its own MLM head tied to
  the word embeddings.
- Generator and discriminator share the whole embedding block: the word, position and segment
  tables and the embedding LayerNorm (the authors' "embeddings" variable scope); each projects the
  tables' width E to its own width when they differ (E = the discriminator's `embedding_size`).
- Masking: 15% of the tokens, 85% of those replaced by [MASK] and 15% kept (no random tokens), the
  generator's MLM loss on them; each masked position then holds a token sampled from the
  generator's softmax at temperature 1 (no gradient flows through the sample).
- The discriminator's labels are `corrupted != original` at every real token, so a sample that
  restores the original token counts as original; its loss is the mean binary cross-entropy over
  real tokens (specials included, as the authors weight by the input mask), and the total is
  MLM + lambda * RTD with lambda = 50.
Deviation: samples are drawn by the inverse CDF from a generator seeded by (seed, step), the same
distribution as the authors' Gumbel-max, so a resumed run draws the same tokens.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plmodels.config import Config

from .encoder import Encoder, EncoderConfig

IGNORE_INDEX = -100


@dataclass(frozen=True)
class ElectraConfig(Config):
    """The ELECTRA-specific training fields (`PretrainConfig.objective_args` of objective "electra")."""

    generator_frac: float = 0.25  # generator width (hidden, heads, FFN) as a share of the discriminator's
    rtd_weight: float = 50.0  # lambda: loss = MLM(generator) + lambda * RTD(discriminator)
    temperature: float = 1.0  # softmax temperature of the generator's samples

    def __post_init__(self) -> None:
        if not 0.0 < self.generator_frac <= 1.0:
            raise ValueError(f"ElectraConfig.generator_frac must be in (0, 1], got {self.generator_frac}")
        if self.rtd_weight < 0:
            raise ValueError(f"ElectraConfig.rtd_weight must be >= 0, got {self.rtd_weight}")
        if self.temperature <= 0:
            raise ValueError(f"ElectraConfig.temperature must be > 0, got {self.temperature}")


def generator_config(disc: EncoderConfig, frac: float) -> EncoderConfig:
    """The generator's shape: the discriminator's depth and style, width, heads and FFN times `frac`
    (heads at least 1, head width kept a divisor), embedding tables of the discriminator's width E,
    an MLM head and no other head."""
    heads = max(1, round(disc.n_heads * frac))
    width = max(heads, int(round(disc.d_model * frac / heads)) * heads)
    return dataclasses.replace(
        disc, d_model=width, n_heads=heads, d_ff=max(1, int(round(disc.d_ff * frac))),
        embedding_size=disc.embedding_width, use_rtd=False, use_nsp=False, pruned_heads={},
    )


class ElectraPair(nn.Module):
    """The generator and the discriminator, trained together; `discriminator` is the analysed model.

    The generator's embedding block *is* the discriminator's (same modules, so same parameters: one
    tensor each in `parameters()`, receiving both models' gradients). Each model keeps its own
    projection E -> width."""

    def __init__(self, disc_config: EncoderConfig, cfg: ElectraConfig = ElectraConfig()) -> None:
        super().__init__()
        if disc_config.use_nsp:
            raise ValueError("ELECTRA has no next-sentence head (EncoderConfig.use_nsp must be false)")
        self.cfg = cfg
        self.discriminator = Encoder(dataclasses.replace(disc_config, use_rtd=True))
        self.generator = Encoder(generator_config(self.discriminator.config, cfg.generator_frac))
        share_embeddings(self.generator, self.discriminator)


SHARED_EMBEDDINGS = ("word", "position", "segment", "norm")


def share_embeddings(generator: Encoder, discriminator: Encoder) -> None:
    """Make the generator's word / position / segment tables and embedding LayerNorm the
    discriminator's modules (what exists in both)."""
    for name in SHARED_EMBEDDINGS:
        if getattr(discriminator.embeddings, name) is not None:
            setattr(generator.embeddings, name, getattr(discriminator.embeddings, name))


def generator_state(pair: ElectraPair) -> dict[str, torch.Tensor]:
    """The generator's own tensors (the shared embedding block left out: it is the discriminator's)."""
    shared = {f"embeddings.{n}." for n in SHARED_EMBEDDINGS}
    return {k: v for k, v in pair.generator.state_dict().items() if not any(k.startswith(s) for s in shared)}


def sample_replacements(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """(M, V) generator logits -> (M,) token ids sampled from softmax(logits / temperature).

    By the inverse CDF: one uniform u per row, the first id whose cumulative probability exceeds
    u * total (a token of probability 0 is never drawn). The same law as `torch.multinomial` or the
    authors' Gumbel-max, at one random number per row instead of one per vocabulary entry
    (multinomial's exponential draws took a third of the step at V = 16,000). `generator` is on
    the logits' device (`sampling_generator`): nothing is copied to the host, row i's sample is a
    function of the generator's seed and of row i only."""
    cdf = torch.softmax(logits.detach().float() / temperature, dim=-1).cumsum(-1)  # (M, V)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]  # (M, 1)
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(cdf.shape[1] - 1)


def sampling_generator(seed: int, device: torch.device) -> torch.Generator:
    """A generator on `device` seeded with `seed` (the trainer draws one seed a step on the host, so
    a resumed run samples what the uninterrupted one did on the same kind of device)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def rtd_labels(corrupted: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """(B, T) float: 1 where the discriminator's input differs from the original text, else 0
    (a sampled token equal to the original is "original", as in the paper)."""
    return (corrupted != original).float()


@dataclass
class ElectraLoss:
    """What one ELECTRA step computes: the total and its parts, and the discriminator's inputs."""

    loss: torch.Tensor
    mlm: torch.Tensor
    rtd: torch.Tensor
    n_masked: torch.Tensor  # () the number of masked positions, on the device
    replaced: torch.Tensor  # (B, T) the discriminator's input
    labels: torch.Tensor  # (B, T) its targets, 1 = replaced
    rtd_logits: torch.Tensor  # (B, T)


def electra_loss(pair: ElectraPair, original: torch.Tensor, masked: torch.Tensor, generator: torch.Generator, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, *, slots) -> ElectraLoss:
    """One step's loss. original / masked: (B, T) ids, the generator's input (with [MASK]); `slots`,
    the masked positions and their labels in fixed-size slots (plmodels.training.masking.MaskedSlots:
    index (B, Q), rows / positions / targets (M,), count);
    `generator` (on the device) draws the samples.

    MLM: mean cross-entropy of the generator at the masked positions. RTD: the discriminator reads
    `masked` with every masked position set to the generator's sample, and predicts per real token
    whether it differs from `original`; mean binary cross-entropy over real tokens. Every shape is
    set by the slots, and nothing is read back to the host."""
    g = pair.generator
    if attention_mask is None:  # the generator's last block at the slots only (exact)
        rows = g.hidden_at(masked, slots.index, token_type_ids)  # (B, Q, Dg)
        g_hidden = rows.flatten(0, 1).index_select(0, slots.rows)  # (M, Dg)
    else:
        g_hidden = g(masked, attention_mask, token_type_ids, attn_impl="sdpa").last_hidden_state
        g_hidden = g_hidden.flatten(0, 1).index_select(0, slots.positions)  # (M, Dg)
    g_logits = g.mlm_logits(g_hidden)  # (M, V)
    mlm = F.cross_entropy(g_logits.float(), slots.targets, reduction="sum") / slots.count.clamp_min(1.0)
    # the samples written at the masked positions; a padding slot (an unmasked position) keeps its id
    flat = masked.flatten()
    kept = flat.index_select(0, slots.positions)
    sampled = torch.where(slots.targets != IGNORE_INDEX,
                          sample_replacements(g_logits, pair.cfg.temperature, generator), kept)
    replaced = flat.scatter(0, slots.positions, sampled).view_as(masked)
    y = rtd_labels(replaced, original)
    d = pair.discriminator
    hidden = d(replaced, attention_mask, token_type_ids, attn_impl="sdpa").last_hidden_state  # (B, T, D)
    logits = d.rtd_logits(hidden).float()  # (B, T)
    real = torch.ones_like(y) if attention_mask is None else attention_mask.float()
    bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    rtd = (bce * real).sum() / real.sum().clamp_min(1.0)
    return ElectraLoss(mlm + pair.cfg.rtd_weight * rtd, mlm, rtd, slots.count, replaced, y, logits)
