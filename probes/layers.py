"""Layer-wise probing analyses (Tenney et al. 2019b, "BERT rediscovers the classical NLP pipeline").

For layers l = 0..L (0 = embeddings, the lexical baseline):
- per-layer scores: one probe per layer; the best single layer is chosen on held-out test items
      (cross-fitting over two halves of them, `cross_fit_best`), not on the items it is scored on.
- scalar mix: one probe on a learned mix of all layers; its softmax weights s_l give the
      expected layer        E_s[l] = sum_l l * s_l                                   (`expected_layer`)
- cumulative scores: probe P^(l) on a scalar mix of layers 0..l; differential scores
      delta_l = Score(P^(l)) - Score(P^(l-1)) for l >= 1, delta_0 := 0       (`differential_scores`)
  and the center of gravity
      E_delta[l] = sum_l l * delta_l / sum_l delta_l                               (`center_of_gravity`)
Results are tidy pandas DataFrames in the `probing`, `probing_summary` and `mix_weights` schemas of
docs/design.md. Each per-seed row carries a 95% bootstrap interval over test items; with several
seeds an extra row with seed = -1 holds the mean over seeds and its t interval (`probes.stats`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from probes.edge import EdgeProbe, as_layers, make_probe
from probes.stats import bootstrap_ci, mean_ci, micro_f1_from_counts

PROBING_COLUMNS = ["model", "task", "probe", "pooling", "layer", "mode", "metric", "value", "seed",
                   "ci_low", "ci_high"]
SUMMARY_COLUMNS = ["model", "task", "metric", "value"]
MIX_COLUMNS = ["model", "task", "layer", "weight", "seed"]
METRICS = ("accuracy", "micro_f1")


@dataclass(frozen=True)
class ProbeData:
    """One split's probe inputs: X per layer ((L+1, N_words, D) array or list of (N_words, D) memmaps),
    y (N_targets,), span1 / span2 (N_targets, 2) global word rows, end exclusive (span2 may be None)."""

    X: Any
    y: Any
    span1: Any
    span2: Any = None

    @property
    def n_layers(self) -> int:
        return len(as_layers(self.X))

    def layers(self, which: Sequence[int]) -> list[np.ndarray]:
        all_layers = as_layers(self.X)
        bad = [l for l in which if not 0 <= l < len(all_layers)]
        if bad:
            raise ValueError(f"layers {bad} out of range: the data has {len(all_layers)} layers")
        return [all_layers[l] for l in which]

    def with_labels(self, y: Any) -> "ProbeData":
        return ProbeData(self.X, y, self.span1, self.span2)


@dataclass(frozen=True)
class LayerResult:
    """Tables produced by one analysis (schemas in docs/design.md)."""

    probing: pd.DataFrame
    summary: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SUMMARY_COLUMNS))
    mix_weights: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MIX_COLUMNS))


# ----------------------------------------------------------------------------- pure formulas
def expected_layer(s: Sequence[float], layer_ids: Sequence[int] | None = None) -> float:
    """E_s[l] = sum_l l * s_l for mixing weights s (non-negative, summing to 1; Tenney et al. 2019b).

    e.g. s = [0.1, 0.2, 0.7] -> 0*0.1 + 1*0.2 + 2*0.7 = 1.6. `layer_ids` names the layers (default 0..K-1).
    """
    s = np.asarray(s, dtype=float)
    if s.ndim != 1 or np.any(s < 0) or not np.isclose(s.sum(), 1.0, atol=1e-6):
        raise ValueError(f"expected_layer: s must be a 1-D distribution (>= 0, sum 1), got {s.tolist()}")
    ids = np.arange(len(s)) if layer_ids is None else np.asarray(layer_ids, dtype=float)
    return float(np.dot(ids, s))


def differential_scores(cumulative: Sequence[float]) -> np.ndarray:
    """delta_l = score(l) - score(l-1) for l >= 1, and delta_0 = 0 (no earlier layer to gain over)."""
    c = np.asarray(cumulative, dtype=float)
    return np.concatenate([[0.0], np.diff(c)])


def center_of_gravity(delta: Sequence[float], layer_ids: Sequence[int] | None = None) -> float:
    """E_delta[l] = sum_l l * delta_l / sum_l delta_l (Tenney et al. 2019b).

    nan when sum_l delta_l <= 0 (the cumulative score never improved on layer 0: undefined).
    """
    d = np.asarray(delta, dtype=float)
    ids = np.arange(len(d)) if layer_ids is None else np.asarray(layer_ids, dtype=float)
    total = d.sum()
    return float(np.dot(ids, d) / total) if total > 0 else float("nan")


# ----------------------------------------------------------------------------- fitting helpers
def _fit_eval(train: ProbeData, test: ProbeData, layer_ids: Sequence[int], probe: str,
              params: dict, seed: int, dev: ProbeData | None) -> tuple[EdgeProbe, np.ndarray]:
    """Fit one probe on train (layers `layer_ids`) and return it with per-item test counts (N, 4)."""
    p = make_probe(probe, **{**params, "seed": seed})
    val = {} if dev is None else dict(X_val=dev.layers(layer_ids), y_val=dev.y, span1_val=dev.span1,
                                      span2_val=dev.span2)
    p.fit(train.layers(layer_ids), train.y, train.span1, train.span2, **val)
    return p, p.per_item(test.layers(layer_ids), test.y, test.span1, test.span2)


def _metric_rows(items: np.ndarray, base: dict, seed: int, n_boot: int) -> list[dict]:
    """Per-seed rows for accuracy and micro-F1 with bootstrap CIs over test items."""
    rows = []
    for metric, data, stat in (("accuracy", items[:, 0], np.mean),
                               ("micro_f1", items[:, 1:], micro_f1_from_counts)):
        if n_boot > 0:
            v, lo, hi = bootstrap_ci(data, stat, n_boot=n_boot, seed=seed)
        else:
            v, lo, hi = float(stat(data)), float("nan"), float("nan")
        rows.append({**base, "metric": metric, "value": v, "seed": seed, "ci_low": lo, "ci_high": hi})
    return rows


def _seed_aggregates(rows: list[dict]) -> list[dict]:
    """Add a seed = -1 row (mean over seeds, t interval) per (layer, mode, metric) with >1 seed."""
    df = pd.DataFrame(rows)
    out = []
    for _, g in df.groupby(["layer", "mode", "metric"], sort=False):
        if len(g) > 1:
            m, lo, hi = mean_ci(g["value"].to_numpy())
            out.append({**g.iloc[0].to_dict(), "value": m, "seed": -1, "ci_low": lo, "ci_high": hi})
    return rows + out


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns)


def _base(model: str, task: str, probe: str, params: dict, layer: int, mode: str) -> dict:
    pooling = params.get("pooling", make_probe(probe).pooling)
    return {"model": model, "task": task, "probe": probe, "pooling": pooling, "layer": layer, "mode": mode}


# ----------------------------------------------------------------------------- analyses
def per_layer_scores(train: ProbeData, test: ProbeData, *, layers: Sequence[int] | None = None,
                     dev: ProbeData | None = None, probe: str = "edge", probe_params: dict | None = None,
                     seeds: Sequence[int] = (0,), model: str = "", task: str = "", n_boot: int = 1000,
                     items_out: dict | None = None) -> pd.DataFrame:
    """One probe per layer l (mode "single"); `probing` rows for accuracy and micro-F1 per seed.
    `items_out`, when given, receives each fit's per-item test counts (N, 4) = [correct, tp, fp, fn]
    under ("single", layer, seed) (the multi-bootstrap over seeds x items reads them).

    With more than one layer, also mode "best": the best single layer chosen on held-out test items
    (`cross_fit_best`), layer = that layer (-1 when the two halves choose differently), value = the
    cross-fitted score over all test items. Its interval is over items for the chosen layers; it does
    not carry the uncertainty of the choice itself."""
    params = dict(probe_params or {})
    layers = list(range(train.n_layers)) if layers is None else list(layers)
    rows: list[dict] = []
    items: dict[tuple[int, int], np.ndarray] = {}
    for l in layers:
        for seed in seeds:
            _, items[l, seed] = _fit_eval(train, test, [l], probe, params, seed, dev)
            rows += _metric_rows(items[l, seed], _base(model, task, probe, params, l, "single"), seed, n_boot)
            if items_out is not None:
                items_out["single", l, seed] = items[l, seed]
    if len(layers) > 1:
        layer, chosen = cross_fit_best(items, layers, seeds)
        for seed in seeds:
            rows += _metric_rows(chosen[seed], _base(model, task, probe, params, layer, "best"), seed, n_boot)
    return _frame(_seed_aggregates(rows), PROBING_COLUMNS)


def cross_fit_best(items: dict[tuple[int, int], np.ndarray], layers: Sequence[int], seeds: Sequence[int]
                   ) -> tuple[int, dict[int, np.ndarray]]:
    """The best single layer chosen on held-out items (cross-fitting over two halves of the test items).

    Picking the best of L+1 layers and reporting its score on the same items over-states it (the
    maximum of noisy scores). So: split the test items into a first and a second half (items come in
    sentence order, so at most one sentence straddles the cut); choose the layer with the best
    seed-mean accuracy on one half (ties -> the lower layer) and score each item of the other half at
    that layer. Returns (layer, {seed: (N, 4) per-item counts at the layer chosen on the other half}):
    layer is the choice of both halves, or -1 when the halves disagree (no single best layer is
    determined by these items). Below 2 items the halves cannot be formed: ValueError.
    """
    n = len(next(iter(items.values())))
    if n < 2:
        raise ValueError(f"cross_fit_best: need at least 2 test items to choose a layer on held-out items, got {n}")
    halves = [np.arange(n // 2), np.arange(n // 2, n)]
    picks = []
    for half in halves:
        acc = [np.mean([items[l, s][half, 0].mean() for s in seeds]) for l in layers]
        picks.append(layers[int(np.argmax(acc))])
    chosen = {}
    for seed in seeds:
        out = np.empty_like(items[layers[0], seed])
        out[halves[1]] = items[picks[0], seed][halves[1]]     # chosen on the first half, scored on the second
        out[halves[0]] = items[picks[1], seed][halves[0]]
        chosen[seed] = out
    return (picks[0] if picks[0] == picks[1] else -1), chosen


def scalar_mix_probe(train: ProbeData, test: ProbeData, *, layers: Sequence[int] | None = None,
                     dev: ProbeData | None = None, probe: str = "edge", probe_params: dict | None = None,
                     seeds: Sequence[int] = (0,), model: str = "", task: str = "", n_boot: int = 1000
                     ) -> LayerResult:
    """One probe on a scalar mix of `layers` (mode "mix", layer -1), its weights s_l per seed and the
    summary E_s[l] = sum_l l s_l, averaged over seeds."""
    params = dict(probe_params or {})
    layers = list(range(train.n_layers)) if layers is None else list(layers)
    if len(layers) < 2:
        raise ValueError(f"scalar_mix_probe: needs at least 2 layers, got {layers}")
    rows, weights, e_s = [], [], []
    for seed in seeds:
        p, items = _fit_eval(train, test, layers, probe, params, seed, dev)
        rows += _metric_rows(items, _base(model, task, probe, params, -1, "mix"), seed, n_boot)
        weights += [{"model": model, "task": task, "layer": l, "weight": float(w), "seed": seed}
                    for l, w in zip(layers, p.mix_weights_)]
        e_s.append(expected_layer(p.mix_weights_, layers))
    summary = [{"model": model, "task": task, "metric": "expected_layer", "value": float(np.mean(e_s))}]
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS), _frame(summary, SUMMARY_COLUMNS),
                       _frame(weights, MIX_COLUMNS))


def cumulative_scores(train: ProbeData, test: ProbeData, *, layers: Sequence[int] | None = None,
                      dev: ProbeData | None = None, probe: str = "edge", probe_params: dict | None = None,
                      seeds: Sequence[int] = (0,), model: str = "", task: str = "", metric: str = "micro_f1",
                      n_boot: int = 1000, items_out: dict | None = None) -> LayerResult:
    """P^(l) on a scalar mix of layers[0..i] for each i (mode "cumulative", layer = layers[i]), plus
    differential rows (metric "delta_<metric>", from the seed means) and the summary center of gravity.
    `items_out` as `per_layer_scores`' (keys ("cumulative", layer, seed))."""
    if metric not in METRICS:
        raise ValueError(f"cumulative_scores: metric={metric!r}; choose one of {METRICS}")
    params = dict(probe_params or {})
    layers = list(range(train.n_layers)) if layers is None else list(layers)
    rows: list[dict] = []
    for i, l in enumerate(layers):
        for seed in seeds:
            _, items = _fit_eval(train, test, layers[:i + 1], probe, params, seed, dev)
            rows += _metric_rows(items, _base(model, task, probe, params, l, "cumulative"), seed, n_boot)
            if items_out is not None:
                items_out["cumulative", l, seed] = items
    df = pd.DataFrame(rows)
    means = df[df["metric"] == metric].groupby("layer", sort=False)["value"].mean().reindex(layers).to_numpy()
    delta = differential_scores(means)
    rows += [{**_base(model, task, probe, params, l, "cumulative"), "metric": f"delta_{metric}", "value": float(d),
              "seed": -1, "ci_low": float("nan"), "ci_high": float("nan")} for l, d in zip(layers, delta)]
    summary = [{"model": model, "task": task, "metric": "center_of_gravity",
                "value": center_of_gravity(delta, layers)}]
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS), _frame(summary, SUMMARY_COLUMNS))
