"""Logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens") and tuned lens (Belrose et al.
2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens").

The logit lens reads layer l's residual vector h_l through the model's own output head,
logits_l = head(h_l), where head is whatever the model applies to its last layer (a pre-LN model's final
LayerNorm, then the unembedding; an encoder's MLM transform and projection). At the last layer this is
the model's own distribution (tests/probes/test_lens.py checks it to float precision).

The tuned lens learns one affine translator per layer, logits_l = head(h_l + A_l h_l + b_l), A_l and b_l
initialised at zero (so training starts from the logit lens), trained to minimise
KL(p_final || p_l) on held-out text (Belrose et al., eq. 3: the distillation loss); the last layer's
translator is the identity. `TunedLens` is shaped like a scikit-learn estimator (`fit(H, final)`,
`transform`, `score`) and saves its translators as safetensors (`save` / `TunedLens.load`; never pickle).

Per-layer metrics (`lens_metrics`): KL(p_final || p_l) in nats, top-1 agreement with the final
distribution, and the LM loss (cross-entropy, nats) of the targets read through the lens.

How a family's head reads a vector is the one per-family fact this module needs: the family record's
`residual_logits` (plmodels/families.py; encoder and decoder today).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from plmodels.families import FAMILIES, family_of
from plmodels.files import save_safetensors, write_json_atomic


def lm_readout(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The readout h (..., D) -> logits (..., V) of `model`: its family's `residual_logits`
    (plmodels/families.py: a pre-LN model's final LayerNorm, then its LM head); a family without one is
    a ValueError naming the kinds that have one."""
    fam = family_of(model)
    if fam.residual_logits is None:
        have = sorted(k for k, f in FAMILIES.items() if f.residual_logits is not None)
        raise ValueError(f"lens: model kind {fam.kind!r} has no LM readout here; kinds with one: {have}")
    fn = fam.residual_logits
    return lambda h: fn(model, h)


def logit_lens(readout: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    """hidden (L+1, N, D) -> logits (L+1, N, V): every layer read through the model's own head."""
    return torch.stack([readout(h) for h in hidden])


@torch.no_grad()
def lens_metrics(logits: torch.Tensor, final: torch.Tensor, targets: torch.Tensor | None = None,
                 final_logp: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-item metrics of one layer's lens: logits, final (N, V), targets (N,) token ids or None ->
    {"kl": (N,) KL(p_final || p_l) nats, "top1_agree": (N,) 0/1, "lm_loss": (N,) nats (with targets)}.
    final_logp: log_softmax(final) when the caller reads many layers against one final distribution."""
    logp = F.log_softmax(final.float(), -1) if final_logp is None else final_logp
    logq = F.log_softmax(logits.float(), -1)
    out = {"kl": (logp.exp() * (logp - logq)).sum(-1),
           "top1_agree": (logits.argmax(-1) == final.argmax(-1)).float()}
    if targets is not None:
        out["lm_loss"] = -logq.gather(-1, targets[:, None])[:, 0]  # = F.cross_entropy, without a second log_softmax
    return out


class TunedLens:
    """Per-layer affine translators trained to match the final distribution (Belrose et al. 2023).

    readout: h (..., D) -> logits (..., V) (`lm_readout(model)`); n_steps, lr, batch_size: Adam on the
    KL loss per layer; seed. Fitted: `weight_` (L, D, D) and `bias_` (L, D) for layers 0..L-1 (layer L
    is the identity), `train_kl_` (L,) final training KL per layer."""

    def __init__(self, readout: Callable[[torch.Tensor], torch.Tensor] | None = None, n_steps: int = 200,
                 lr: float = 1e-3, batch_size: int = 512, seed: int = 0) -> None:
        self.readout = readout
        self.n_steps = n_steps
        self.lr = lr
        self.batch_size = batch_size
        self.seed = seed

    def fit(self, hidden: torch.Tensor, final: torch.Tensor | None = None) -> "TunedLens":
        """hidden (L+1, N, D) vectors of held-out tokens; final (N, V) the model's logits (None: the
        readout of hidden[-1])."""
        if self.readout is None:
            raise ValueError("TunedLens.fit: give readout= (probes.lens.lm_readout(model))")
        if hidden.ndim != 3:
            raise ValueError(f"TunedLens.fit: hidden must be (L+1, N, D), got {tuple(hidden.shape)}")
        hidden = hidden.detach().float()
        L, N, D = hidden.shape[0] - 1, hidden.shape[1], hidden.shape[2]
        with torch.no_grad():
            target = F.log_softmax((self.readout(hidden[-1]) if final is None else final).float(), -1)  # (N, V)
        gen = torch.Generator().manual_seed(self.seed)
        weights, biases, kls = [], [], []
        for l in range(L):  # one layer at a time: a (batch, V) step stays in cache; all layers at once ran 1.6x slower
            W = torch.zeros(D, D, requires_grad=True)
            b = torch.zeros(D, requires_grad=True)
            opt = torch.optim.Adam([W, b], lr=self.lr)
            for _ in range(self.n_steps):
                idx = torch.randint(0, N, (min(self.batch_size, N),), generator=gen)
                h = hidden[l, idx]
                logq = F.log_softmax(self.readout(h + h @ W.T + b).float(), -1)
                loss = F.kl_div(logq, target[idx], log_target=True, reduction="batchmean")
                # gradients of W and b only: the readout's own weights (the (V, D) unembedding) are
                # neither trained nor given a .grad
                W.grad, b.grad = torch.autograd.grad(loss, [W, b])
                opt.step()
            weights.append(W.detach())
            biases.append(b.detach())
            kls.append(float(loss.detach()))
        self.weight_ = torch.stack(weights) if weights else torch.zeros(0, D, D)
        self.bias_ = torch.stack(biases) if biases else torch.zeros(0, D)
        self.train_kl_ = kls
        return self

    def translate(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """h (..., D) of `layer` -> the translated vector h + A h + b (the identity at the last layer)."""
        if layer >= len(self.weight_):
            return h
        return h + h @ self.weight_[layer].T + self.bias_[layer]

    @torch.no_grad()
    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (L+1, N, D) -> tuned-lens logits (L+1, N, V)."""
        return torch.stack([self.readout(self.translate(l, h.float())) for l, h in enumerate(hidden)])

    def score(self, hidden: torch.Tensor, final: torch.Tensor | None = None) -> list[float]:
        """Mean KL(p_final || p_l) per layer (nats) on (L+1, N, D) vectors."""
        final = self.readout(hidden[-1].float()) if final is None else final
        return [float(lens_metrics(z, final)["kl"].mean()) for z in self.transform(hidden)]

    def save(self, folder: str | Path) -> Path:
        """Write `tuned_lens.safetensors` and `tuned_lens.json` (settings, training KL) into folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "tuned_lens.safetensors"
        save_safetensors({"weight": self.weight_.contiguous(), "bias": self.bias_.contiguous()}, path)
        write_json_atomic(folder / "tuned_lens.json", {"n_steps": self.n_steps, "lr": self.lr,
                                                       "batch_size": self.batch_size, "seed": self.seed,
                                                       "train_kl": self.train_kl_})
        return path

    @classmethod
    def load(cls, folder: str | Path, readout: Callable[[torch.Tensor], torch.Tensor]) -> "TunedLens":
        """A fitted lens from `save`'s files, reading through `readout`."""
        folder = Path(folder)
        meta = json.loads((folder / "tuned_lens.json").read_text())
        lens = cls(readout=readout, n_steps=meta["n_steps"], lr=meta["lr"], batch_size=meta["batch_size"],
                   seed=meta["seed"])
        tensors = load_file(str(folder / "tuned_lens.safetensors"))
        lens.weight_, lens.bias_, lens.train_kl_ = tensors["weight"], tensors["bias"], meta["train_kl"]
        return lens
