"""Minimum description length probing with the online code (Voita & Titov 2020, "Information-Theoretic
Probing with Minimum Description Length").

The N training targets are shuffled (by seed) and cut at t_i = max(1, round(p_i N)) for the portions
p = 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25, 50, 100 %. With K labels:

    L_online = t_1 log2 K + sum_{i=1}^{n-1} sum_{j = t_i}^{t_{i+1} - 1} -log2 p_{theta_i}(y_j | x_j)

where theta_i is a probe trained on the first t_i targets (first block sent with the uniform code).
    L_uniform = N log2 K,         compression = L_uniform / L_online          (all in bits)
Probabilities are floored at 1e-12 (at most ~40 bits per target) so a confident miss stays finite.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from probes.edge import make_probe

PORTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)
_P_FLOOR = 1e-12


@dataclass(frozen=True)
class MDLResult:
    online_codelength: float          # bits
    uniform_codelength: float         # bits
    compression: float                # uniform / online
    n_classes: int
    boundaries: tuple[int, ...]       # t_1 < ... < t_n = N
    block_codelengths: tuple[float, ...]  # bits per block; block 0 is the uniform-coded first block

    def rows(self, model: str = "", task: str = "", probe: str = "edge", pooling: str = "", layer: int = -1,
             seed: int = 0) -> list[dict]:
        """`probing` table rows (mode "mdl"): metrics online_codelength_bits, uniform_codelength_bits, compression."""
        base = {"model": model, "task": task, "probe": probe, "pooling": pooling, "layer": layer, "mode": "mdl",
                "seed": seed, "ci_low": float("nan"), "ci_high": float("nan")}
        return [{**base, "metric": m, "value": v} for m, v in (
            ("online_codelength_bits", self.online_codelength),
            ("uniform_codelength_bits", self.uniform_codelength), ("compression", self.compression))]


def uniform_codelength(n: int, n_classes: int) -> float:
    """N log2 K bits."""
    return float(n * np.log2(n_classes))


def block_boundaries(n: int, portions: Sequence[float] = PORTIONS) -> tuple[int, ...]:
    """Cut points t_i = max(1, round(p_i n)), strictly increasing (repeated cuts of tiny n dropped), ending at n."""
    if n < 2:
        raise ValueError(f"block_boundaries: need at least 2 targets, got {n}")
    if sorted(portions) != list(portions) or portions[-1] != 1.0:
        raise ValueError(f"portions must increase and end at 1.0, got {portions}")
    cuts = sorted({min(n, max(1, int(round(p * n)))) for p in portions})
    return tuple(cuts)


def online_codelength(X: Any, y: Any, span1: Any, span2: Any = None, *, probe: str = "edge",
                      probe_params: dict | None = None, portions: Sequence[float] = PORTIONS,
                      seed: int = 0) -> MDLResult:
    """Online (prequential) codelength of labels y given span representations (single-label only)."""
    params = dict(probe_params or {})
    if params.get("multilabel"):
        raise ValueError("online_codelength: multilabel probes are not supported (codelength of one label per target)")
    y = np.asarray(y)
    classes = np.unique(y)
    k, n = len(classes), len(y)
    if k < 2:
        raise ValueError(f"online_codelength: need at least 2 labels, got {classes.tolist()}")
    order = np.random.default_rng(seed).permutation(n)
    s1 = np.asarray(span1)[order]
    s2 = None if span2 is None else np.asarray(span2)[order]
    ys = y[order]
    cuts = block_boundaries(n, portions)
    blocks = [uniform_codelength(cuts[0], k)]
    for t, t_next in zip(cuts[:-1], cuts[1:]):
        p = make_probe(probe, **{**params, "classes": classes.tolist(), "seed": seed})
        p.fit(X, ys[:t], s1[:t], None if s2 is None else s2[:t])
        proba = p.predict_proba(X, s1[t:t_next], None if s2 is None else s2[t:t_next])
        true = np.searchsorted(p.classes_, ys[t:t_next])
        blocks.append(float(-np.log2(np.maximum(proba[np.arange(len(true)), true], _P_FLOOR)).sum()))
    online, uniform = float(sum(blocks)), uniform_codelength(n, k)
    return MDLResult(online, uniform, uniform / online, k, cuts, tuple(blocks))
