"""Causal mediation analysis of one intervention on the input (Pearl 2001; Vig et al. 2020,
"Investigating gender bias in language models using causal mediation analysis", Sec. 3; Finlayson
et al. 2021, "Causal analysis of syntactic agreement mechanisms in neural language models", Sec. 3),
computed from the scores that `probes.patching.patch_sites` returns.

The response is Finlayson et al.'s y(u) = p(w_wrong | u) / p(w_right | u), w_right the form that
agrees with the unintervened input u (a singular verb after a singular subject) and w_wrong the other.
With d(u) = log p(w_right | u) - log p(w_wrong | u), the log-probability difference `patch_sites` is
run with, y = exp(-d); when both forms are one token read at the same position the softmax normaliser
cancels and d is the logit difference logit(w_right) - logit(w_wrong). For the
intervention u -> u' (the subject's number swapped) and a mediator z (one site):

    TE       = y(u') / y(u) - 1                 = exp(d(u) - d(u')) - 1
    NIE(z)   = y(u; z <- z(u')) / y(u) - 1      = exp(d(u) - d(u; z <- z(u'))) - 1   (the noising run)
    NDE(z)   = y(u'; z <- z(u)) / y(u) - 1      = exp(d(u) - d(u'; z <- z(u))) - 1   (the denoising run)

each averaged over items u (scale "ratio", the papers' numbers). Scale "log" averages the exponents
instead (d(u) - d(u'), ...): the same effects in nats of d, additive over items and
free of the ratio's heavy tail (one confident item can carry the ratio mean). `restored` is the
denoising run's share of d brought back, mean(d(u'; z <- z(u)) - d(u')) /
mean(d(u) - d(u')) (Heimersheim & Nanda 2024's normalised patching metric).

Interchange intervention accuracy (Geiger et al. 2021, "Causal abstractions of neural networks", Sec.
3): the hypothesis "site z holds the subject's number" predicts that the clean run with z set to its
value under u' prefers the form that agrees with u', i.e. d(u; z <- z(u')) < 0. `interchange_hits` is
that indicator per site and item; its mean is the IIA, and the model's own d(u') < 0 share is its
ceiling (a site that carries the whole input reaches exactly that).

Intervals: a percentile bootstrap over items, the same resamples for every site (`bootstrap_rows`).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

# scale -> the per-item effect from the exponent delta = d(u) - d(...)
SCALES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"ratio": np.expm1, "log": lambda delta: delta}


def _as2d(a: np.ndarray, n: int, name: str) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != n:
        raise ValueError(f"mediation: {name} must be (S, N) with N = {n} items, got {a.shape}")
    return a


def item_effects(clean: np.ndarray, corrupt: np.ndarray, noised: np.ndarray, denoised: np.ndarray,
                 scale: str = "ratio") -> dict[str, np.ndarray]:
    """Per-item effects: {"te": (1, N), "nie": (S, N), "nde": (S, N)} from the log-probability differences d of
    the clean run (N,), the corrupted run (N,), the noising runs (S, N) (clean input, site s from the
    corrupted run) and the denoising runs (S, N) (corrupted input, site s from the clean run)."""
    if scale not in SCALES:
        raise ValueError(f"mediation: scale {scale!r}; choose from {sorted(SCALES)}")
    clean, corrupt = np.asarray(clean, dtype=np.float64), np.asarray(corrupt, dtype=np.float64)
    if clean.ndim != 1 or clean.shape != corrupt.shape:
        raise ValueError(f"mediation: clean and corrupt must be (N,) alike, got {clean.shape} and {corrupt.shape}")
    noised, denoised = _as2d(noised, len(clean), "noised"), _as2d(denoised, len(clean), "denoised")
    f = SCALES[scale]
    return {"te": f(clean - corrupt)[None], "nie": f(clean[None] - noised), "nde": f(clean[None] - denoised)}


def bootstrap_rows(values: np.ndarray, n_boot: int = 1000, level: float = 0.95, seed: int = 0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean (S,), low (S,), high (S,)) of each row of values (S, N) over its N items: a percentile
    bootstrap over items with the same resamples for every row."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(f"bootstrap_rows: values must be (S, N) with N >= 1, got {values.shape}")
    idx = np.random.default_rng(seed).integers(0, values.shape[1], (n_boot, values.shape[1]))
    boots = np.stack([values[:, i].mean(1) for i in idx], 1)  # (S, n_boot)
    lo, hi = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2], axis=1)
    return values.mean(1), lo, hi


def restored_fraction(clean: np.ndarray, corrupt: np.ndarray, denoised: np.ndarray, n_boot: int = 1000,
                      level: float = 0.95, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value (S,), low, high): mean(denoised - corrupt) / mean(clean - corrupt) per site, the ratio of
    means bootstrapped over items (the same resamples for every site)."""
    clean, corrupt = np.asarray(clean, dtype=np.float64), np.asarray(corrupt, dtype=np.float64)
    denoised = _as2d(denoised, len(clean), "denoised")
    gap, gain = clean - corrupt, denoised - corrupt[None]
    idx = np.random.default_rng(seed).integers(0, len(clean), (n_boot, len(clean)))
    boots = np.stack([gain[:, i].mean(1) / gap[i].mean() for i in idx], 1)
    lo, hi = np.quantile(boots, [0.5 - level / 2, 0.5 + level / 2], axis=1)
    return gain.mean(1) / gap.mean(), lo, hi


def interchange_hits(noised: np.ndarray) -> np.ndarray:
    """(S, N) 1.0 where the noising run d(u; z <- z(u')) prefers the form that agrees with u' (d < 0),
    else 0.0: the items on which the interchange intervention at site s behaves as the hypothesis says."""
    noised = np.asarray(noised, dtype=np.float64)
    if noised.ndim != 2:
        raise ValueError(f"interchange_hits: noised must be (S, N), got {noised.shape}")
    return (noised < 0).astype(np.float64)
