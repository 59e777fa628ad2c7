"""Control tasks and baselines for probes (Hewitt & Liang 2019, "Designing and Interpreting Probes
with Control Tasks").

Control task: every word *type* gets a random control label, fixed per type, drawn from the
empirical label distribution of the real task; a probe that scores well on it is memorising types,
not reading structure. Here the draw for type t is a pure function of (seed, t): u = hash(seed, t)
in [0, 1), label = inverse CDF of the empirical distribution (classes sorted) at u. So a type keeps
its label across train/dev/test and across runs, whatever other types are present.

    selectivity = accuracy(task) - accuracy(control)                          (same layer, same probe)

Baselines (no extra code needed):
- lexical baseline = layer 0 of the store (embedding output, no context; Tenney et al. 2019a);
- random-weights model = a store built from a randomly initialised checkpoint of the same
  architecture: probe it like any other model and compare the tables.
"""
from __future__ import annotations

import hashlib
from typing import Any, Hashable, Sequence

import numpy as np
import pandas as pd

from probes.layers import (
    PROBING_COLUMNS,
    SUMMARY_COLUMNS,
    LayerResult,
    ProbeData,
    _base,
    _fit_eval,
    _frame,
    _metric_rows,
    _seed_aggregates,
)

LEXICAL_BASELINE_LAYER = 0


def _type_key(t: Hashable) -> str:
    if isinstance(t, (tuple, list)):
        return "\x1f".join(str(v) for v in t)
    return str(t)


def _unit_hash(seed: int, key: str) -> float:
    h = hashlib.sha256(f"{seed}\x1e{key}".encode()).digest()
    return int.from_bytes(h[:8], "little") / 2.0**64


def control_labels(types: Sequence[Hashable], y: Sequence[Any], seed: int = 0) -> np.ndarray:
    """Control label per target (N_types_given,) from word types (compared as strings).

    y: the real task's labels whose empirical distribution p(c) = count(c) / N is sampled.
    """
    classes, counts = np.unique(np.asarray(y), return_counts=True)
    if len(classes) == 0:
        raise ValueError("control_labels: y is empty, no label distribution to sample")
    cdf = np.cumsum(counts) / counts.sum()
    cache: dict[str, Any] = {}
    out = []
    for t in types:
        key = _type_key(t)
        if key not in cache:
            cache[key] = classes[min(int(np.searchsorted(cdf, _unit_hash(seed, key), side="right")),
                                     len(classes) - 1)]
        out.append(cache[key])
    return np.asarray(out, dtype=classes.dtype)


def span_types(words: Sequence[str], span1: np.ndarray, span2: np.ndarray | None = None) -> list[tuple]:
    """Word type of each target: the words of span1 (and of span2), as a tuple of strings.

    words: (N_words,) the word string of each global row (same rows as the activation store).
    """
    words = np.asarray(words, dtype=object)
    out = []
    for i, (s, e) in enumerate(np.asarray(span1)):
        key = tuple(words[s:e])
        if span2 is not None:
            s2, e2 = span2[i]
            key = key + ("\x1d",) + tuple(words[s2:e2])
        out.append(key)
    return out


def selectivity(task_accuracy: float, control_accuracy: float) -> float:
    """selectivity = accuracy(task) - accuracy(control) (Hewitt & Liang 2019)."""
    return float(task_accuracy) - float(control_accuracy)


def control_task_scores(train: ProbeData, test: ProbeData, train_types: Sequence[Hashable],
                        test_types: Sequence[Hashable], *, layers: Sequence[int] | None = None,
                        task_scores: pd.DataFrame | None = None, probe: str = "edge",
                        probe_params: dict | None = None, seeds: Sequence[int] = (0,), model: str = "",
                        task: str = "", n_boot: int = 1000) -> LayerResult:
    """Probe control labels per layer (mode "control"); selectivity per layer and in the summary.

    Control labels are drawn with seed 0 of `control_labels` from train.y's distribution; each probe
    seed re-fits on the same control task. task accuracy comes from `task_scores` (rows of
    `per_layer_scores`, mode "single", seed-mean) or is fitted here. probing rows: metric "accuracy"/
    "micro_f1" on the control task and "selectivity" (seed-mean). Summary "selectivity" is taken at the
    layer with the best task accuracy.
    """
    params = dict(probe_params or {})
    layers = list(range(train.n_layers)) if layers is None else list(layers)
    classes = np.unique(np.asarray(train.y))
    c_train = train.with_labels(control_labels(train_types, train.y))
    c_test = test.with_labels(control_labels(test_types, train.y))
    ctrl_params = {**params, "classes": classes.tolist()}
    rows: list[dict] = []
    task_acc = _task_accuracy(task_scores, train, test, layers, probe, params, seeds)
    for l in layers:
        accs = []
        for seed in seeds:
            _, items = _fit_eval(c_train, c_test, [l], probe, ctrl_params, seed, None)
            rows += _metric_rows(items, _base(model, task, probe, params, l, "control"), seed, n_boot)
            accs.append(float(items[:, 0].mean()))
        rows.append({**_base(model, task, probe, params, l, "control"), "metric": "selectivity",
                     "value": selectivity(task_acc[l], np.mean(accs)), "seed": -1,
                     "ci_low": float("nan"), "ci_high": float("nan")})
    best = max(layers, key=lambda l: task_acc[l])
    sel = next(r["value"] for r in rows if r["metric"] == "selectivity" and r["layer"] == best)
    summary = [{"model": model, "task": task, "metric": "selectivity", "value": sel}]
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS), _frame(summary, SUMMARY_COLUMNS))


def _task_accuracy(task_scores, train, test, layers, probe, params, seeds) -> dict[int, float]:
    """Seed-mean task accuracy per layer, from a per_layer_scores table or by fitting."""
    if task_scores is not None:
        df = task_scores[(task_scores["mode"] == "single") & (task_scores["metric"] == "accuracy")
                         & (task_scores["seed"] >= 0)]
        acc = df.groupby("layer")["value"].mean().to_dict()
        missing = [l for l in layers if l not in acc]
        if missing:
            raise ValueError(f"control_task_scores: task_scores has no single-layer accuracy for layers {missing}")
        return {l: float(acc[l]) for l in layers}
    return {l: float(np.mean([_fit_eval(train, test, [l], probe, params, s, None)[1][:, 0].mean()
                              for s in seeds])) for l in layers}
