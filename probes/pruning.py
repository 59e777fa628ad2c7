"""Head pruning: metrics, pruning curves, real pruning and comparisons of importance scores.

After Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?", Sec. 4: heads are
removed (gated to 0 with `head_mask`, not cut out) in increasing order of an importance score, and
the metric is recorded after removing 0, 10, ..., 100 % of them; random orders are the baseline.
Their Sec. 4.2 re-scores after each step (iterative pruning); `pruning_curve(scorer=...)` does that.
`prune_model` then cuts heads out for real (`model.prune_heads`) and `measure_speed_and_size`
reports what it buys (Michel et al. Sec. 5).

Meaning of an all-zero layer: masking (or pruning) every head of layer l makes its attention
sub-layer output only the output projection's bias (nothing at all when `bias=False`), so the block
passes the residual stream (+ that bias) to the MLP (`plmodels/components/attention.py`).

Tables: `pruning` (model, method, fraction, metric, value, seed); `kendall_table` gives method_a,
method_b, tau, p_value; `roles_vs_importance` joins the `importance` and `heads_classes` tables.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from safetensors.torch import save_model
from scipy import stats
from torch import Tensor, nn

from plmodels.families import (
    bilm_stat,
    causal_lm_stat,
    denoising_stat,
    masked_lm_logits,
    masked_lm_stat,
    permutation_lm_stat,
)

from .importance import (
    Batch,
    BatchStat,
    check_head_mask,
    evaluate_stat,
    forward,
    head_grid,
    n_real_tokens,
    ones_mask,
    to_device,
)

PRUNING_COLUMNS = ["model", "method", "fraction", "metric", "value", "seed"]
DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(11))


# --------------------------------------------------------------------------- batch statistics
# Each family's LM statistic is its record's `lm_stat` (plmodels/families.py): one function per
# family, shared with the amnesic run and the prune analysis.
mlm_loss = masked_lm_stat  # summed masked-LM cross-entropy, number of predicted tokens (labels: -100 = none)
causal_lm_loss = causal_lm_stat  # summed next-token cross-entropy over real targets, their number
seq2seq_loss = denoising_stat  # teacher-forced cross-entropy over batch["labels"], their number
plm_loss = permutation_lm_stat  # XLNet's query stream at its targets
# bilm_stat: a biLM's mean of both directions' next-token NLLs, summed over its predictions


def mlm_correct(model: nn.Module, batch: Batch, head_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Number of masked positions whose argmax prediction is the label, and number of positions."""
    logits, labels = masked_lm_logits(model, batch, head_mask)
    return (logits.argmax(-1) == labels).sum().float(), torch.tensor(labels.numel())


def _upcast(logits: Tensor) -> Tensor:
    """Half-precision logits are summed in float32; float32 / float64 are kept as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


Classifier = Callable[[nn.Module, Batch, "Tensor | None"], Tensor]


def classification_loss(classify: Classifier) -> BatchStat:
    """Summed cross-entropy of `classify(model, batch, head_mask) -> logits (B, C)` vs batch['labels']."""

    def stat(model: nn.Module, batch: Batch, head_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        logits = classify(model, batch, head_mask)
        return F.cross_entropy(_upcast(logits), batch["labels"], reduction="sum"), torch.tensor(len(logits))

    return stat


def classification_correct(classify: Classifier) -> BatchStat:
    """Number of examples whose argmax of `classify(...)` equals batch['labels'], and their number."""

    def stat(model: nn.Module, batch: Batch, head_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        logits = classify(model, batch, head_mask)
        return (logits.argmax(-1) == batch["labels"]).sum().float(), torch.tensor(len(logits))

    return stat


# --------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class Metric:
    """A dataset metric: transform(sum_b total_b / sum_b count_b) of a batch statistic.

    Call as `metric(model, batches, head_mask=None) -> float`.
    """

    name: str  # the `metric` column of the pruning table
    stat: BatchStat  # (model, batch, head_mask) -> (total, count)
    higher_is_better: bool  # accuracy True, loss / perplexity False
    transform: Callable[[float], float] | None = None  # e.g. exp for perplexity

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Metric.name must be a non-empty string")

    def __call__(self, model: nn.Module, batches: Sequence[Batch], head_mask: Any = None) -> float:
        mask = None if head_mask is None else check_head_mask(head_mask, model)
        value = evaluate_stat(model, batches, self.stat, mask)
        return self.transform(value) if self.transform is not None else value


METRICS: dict[str, Metric] = {
    "mlm_loss": Metric("mlm_loss", mlm_loss, higher_is_better=False),
    "mlm_accuracy": Metric("mlm_accuracy", mlm_correct, higher_is_better=True),
    "causal_lm_loss": Metric("causal_lm_loss", causal_lm_loss, higher_is_better=False),
    "perplexity": Metric("perplexity", causal_lm_loss, higher_is_better=False, transform=math.exp),
    "denoising_loss": Metric("denoising_loss", seq2seq_loss, higher_is_better=False),
    "bilm_loss": Metric("bilm_loss", bilm_stat, higher_is_better=False),
    "plm_loss": Metric("plm_loss", plm_loss, higher_is_better=False),
}


def classification_accuracy(classify: Classifier, name: str = "accuracy") -> Metric:
    """Accuracy of a finetuned classifier `classify(model, batch, head_mask) -> logits (B, C)`."""
    return Metric(name, classification_correct(classify), higher_is_better=True)


# --------------------------------------------------------------------------- pruning curves
Scorer = Callable[[Tensor], np.ndarray]  # current (L, H) mask -> (L, H) importance


def pruning_curve(
    model: nn.Module,
    batches: Sequence[Batch],
    metric: Metric,
    scores: np.ndarray | None = None,
    *,
    scorer: Scorer | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    method: str = "importance",
    model_name: str = "model",
    seed: int = 0,
) -> pd.DataFrame:
    """Metric after masking each fraction of heads, least important first (Michel et al. Sec. 4).

    `scores` (L, H): heads are removed in increasing score order (ties by flat index), cumulatively:
    at fraction f the round(f * L * H) lowest-scored heads are masked. With `scorer` instead, the
    scores are recomputed on the current mask before each step (iterative pruning, Sec. 4.2), and
    the next heads are the lowest-scored among the remaining ones. Returns `pruning` rows.
    """
    n_layers, n_heads = head_grid(model)
    n_total = n_layers * n_heads
    if (scores is None) == (scorer is None):
        raise ValueError("pass exactly one of scores (L, H) and scorer(mask) -> (L, H)")
    if scores is not None:
        scores = _check_scores(scores, (n_layers, n_heads))
    steps = _fraction_counts(fractions, n_total)
    mask = ones_mask(model)
    rows = []
    for frac, n_masked in steps:
        while int((mask == 0).sum()) < n_masked:
            current = scores if scorer is None else _check_scores(scorer(mask.clone()), mask.shape)
            remaining = [i for i in np.argsort(current.ravel(), kind="stable") if mask.view(-1)[i] != 0]
            for i in remaining[: n_masked - int((mask == 0).sum())]:
                mask.view(-1)[i] = 0.0
        value = metric(model, batches, mask)
        rows.append((model_name, method, frac, metric.name, value, seed))
    return pd.DataFrame(rows, columns=PRUNING_COLUMNS)


def random_pruning_curves(
    model: nn.Module,
    batches: Sequence[Batch],
    metric: Metric,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    model_name: str = "model",
) -> pd.DataFrame:
    """Pruning curves for random head orders, one per seed (method "random")."""
    n_layers, n_heads = head_grid(model)
    frames = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(n_layers * n_heads)
        scores = np.empty(n_layers * n_heads)
        scores[order] = np.arange(n_layers * n_heads)  # order[0] is pruned first
        frames.append(
            pruning_curve(model, batches, metric, scores.reshape(n_layers, n_heads),
                          fractions=fractions, method="random", model_name=model_name, seed=seed)
        )
    return pd.concat(frames, ignore_index=True)


def _fraction_counts(fractions: Sequence[float], n_total: int) -> list[tuple[float, int]]:
    fracs = sorted(float(f) for f in fractions)
    bad = [f for f in fracs if not 0.0 <= f <= 1.0]
    if bad or not fracs:
        raise ValueError(f"fractions must be a non-empty list of values in [0, 1]; bad: {bad}")
    return [(f, int(round(f * n_total))) for f in fracs]


def _check_scores(scores: Any, shape: tuple[int, int]) -> np.ndarray:
    arr = np.asarray(scores, dtype=float)
    if arr.shape != tuple(shape):
        raise ValueError(f"scores have shape {arr.shape}; expected (L, H) = {tuple(shape)}")
    if not np.isfinite(arr).all():
        raise ValueError("scores contain NaN or inf")
    return arr


def heads_to_prune_for_loss(
    curve: pd.DataFrame,
    tolerance: float = 0.01,
    n_heads: int | None = None,
    higher_is_better: bool | None = None,
) -> pd.DataFrame:
    """How much can go while the metric stays within `tolerance` (relative) of the unpruned value.

    Per (model, method, metric), seeds are averaged; degradation at fraction f is
    (v_0 - v_f) / |v_0| for a higher-is-better metric, (v_f - v_0) / |v_0| otherwise. The answer is
    the largest f such that every fraction <= f degrades by at most `tolerance` (0.01 = 1 %).
    Direction comes from `higher_is_better` or the metric name in METRICS. Returns model, method,
    metric, tolerance, max_fraction and, when `n_heads` (L * H) is given, n_prunable.
    """
    missing = set(PRUNING_COLUMNS) - set(curve.columns)
    if missing:
        raise ValueError(f"curve lacks pruning columns {sorted(missing)}")
    rows = []
    for (model, method, name), group in curve.groupby(["model", "method", "metric"], sort=False):
        hib = higher_is_better
        if hib is None:
            if name not in METRICS:
                raise ValueError(f"unknown direction for metric {name!r}: pass higher_is_better")
            hib = METRICS[name].higher_is_better
        mean = group.groupby("fraction")["value"].mean().sort_index()
        if mean.index[0] != 0.0:
            raise ValueError(f"curve for {method!r} has no fraction 0 (the unpruned reference)")
        base = mean.iloc[0]
        drop = (base - mean) if hib else (mean - base)
        ok = ((drop / max(abs(base), 1e-12)) <= tolerance + 1e-12).values  # ok[0] is True
        first_fail = len(ok) if ok.all() else int(np.argmin(ok))
        max_fraction = float(mean.index[first_fail - 1])  # the last fraction before a failure
        row = {"model": model, "method": method, "metric": name, "tolerance": tolerance,
               "max_fraction": max_fraction}
        if n_heads is not None:
            row["n_prunable"] = int(round(max_fraction * n_heads))
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- real pruning
def heads_dict(mask_or_dict: Any, model: nn.Module) -> dict[int, list[int]]:
    """{layer: [heads to prune]} from an (L, H) mask (0 = prune) or a dict, checking indices."""
    n_layers, n_heads = len(model.n_heads_per_layer), model.config.n_heads
    if isinstance(mask_or_dict, Mapping):
        out: dict[int, list[int]] = {}
        for layer, heads in mask_or_dict.items():
            if not 0 <= int(layer) < n_layers:
                raise ValueError(f"layer {layer} out of range: the model has {n_layers} layers")
            bad = [h for h in heads if not 0 <= int(h) < n_heads]
            if bad:
                raise ValueError(f"head(s) {bad} of layer {layer} out of range [0, {n_heads})")
            if heads:
                out[int(layer)] = sorted({int(h) for h in heads})
        return out
    mask = check_head_mask(mask_or_dict, model, name="mask")
    return {l: [int(h) for h in torch.nonzero(mask[l] == 0).ravel()]
            for l in range(n_layers) if bool((mask[l] == 0).any())}


def prune_model(model: nn.Module, mask_or_dict: Any) -> nn.Module:
    """A pruned deep copy of `model` (the input is untouched), via `model.prune_heads`.

    mask_or_dict: (L, H) array with 0 at the heads to remove, or {layer: [head ids]}.
    """
    heads = heads_dict(mask_or_dict, model)
    pruned = copy.deepcopy(model)
    if heads:
        pruned.prune_heads(heads)
    return pruned


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    seen = {p.data_ptr(): p.numel() for p in model.parameters()}
    return int(sum(seen.values()))


def safetensors_size(model: nn.Module) -> int:
    """Bytes of the model's weights written with safetensors (shared tensors stored once)."""

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        save_model(model, path)
        return os.path.getsize(path)


def tokens_per_second(model: nn.Module, batches: Sequence[Batch], repeats: int = 5) -> float:
    """Median over `repeats` timed passes of real tokens / second (inference, default attention)."""
    n_tokens = sum(n_real_tokens(b) for b in batches)
    was_training = model.training
    model.eval()
    times = []
    try:
        with torch.inference_mode():
            forward(model, to_device(batches[0], model))  # warm-up (allocator, kernels)
            for _ in range(repeats):
                start = time.perf_counter()
                for batch in batches:
                    forward(model, to_device(batch, model))
                times.append(time.perf_counter() - start)
    finally:
        model.train(was_training)
    return n_tokens / statistics.median(times)


def measure_speed_and_size(
    model_full: nn.Module, model_pruned: nn.Module, batches: Sequence[Batch], repeats: int = 5
) -> dict[str, float]:
    """Parameters, safetensors bytes and inference tokens/s of both models, and pruned/full ratios.

    Timings are interleaved (full, pruned, full, ...) in one process so that load from other work
    hits both alike; each figure is the median of `repeats` passes over `batches`, after one untimed
    pass of each model (a model's first call pays one-off set-up: with one repeat on a tiny model
    that made the pruned model read 500x slower than the full one).
    """
    for m in (model_full, model_pruned):
        tokens_per_second(m, batches[:1], repeats=1)
    full_tps, pruned_tps = [], []
    for _ in range(repeats):
        full_tps.append(tokens_per_second(model_full, batches, repeats=1))
        pruned_tps.append(tokens_per_second(model_pruned, batches, repeats=1))
    out = {
        "params_full": count_parameters(model_full),
        "params_pruned": count_parameters(model_pruned),
        "bytes_full": safetensors_size(model_full),
        "bytes_pruned": safetensors_size(model_pruned),
        "tokens_per_s_full": statistics.median(full_tps),
        "tokens_per_s_pruned": statistics.median(pruned_tps),
    }
    out["params_ratio"] = out["params_pruned"] / out["params_full"]
    out["bytes_ratio"] = out["bytes_pruned"] / out["bytes_full"]
    out["speed_ratio"] = out["tokens_per_s_pruned"] / out["tokens_per_s_full"]
    return out


# --------------------------------------------------------------------------- comparing scores
def kendall_table(importance: pd.DataFrame) -> pd.DataFrame:
    """Kendall's tau (scipy.stats.kendalltau, tau-b) between every pair of methods, per model.

    importance: the `importance` table. Returns model, method_a, method_b, tau, p_value, n_heads.
    """
    rows = []
    for model, group in importance.groupby("model", sort=False):
        wide = group.pivot_table(index=["layer", "head"], columns="method", values="value")
        methods = list(wide.columns)
        for i, a in enumerate(methods):
            for b in methods[i + 1:]:
                both = wide[[a, b]].dropna()
                tau, p = stats.kendalltau(both[a], both[b])
                rows.append((model, a, b, float(tau), float(p), len(both)))
    return pd.DataFrame(rows, columns=["model", "method_a", "method_b", "tau", "p_value", "n_heads"])


def roles_vs_importance(importance: pd.DataFrame, head_roles: pd.DataFrame) -> pd.DataFrame:
    """Are heads of a role (positional, syntactic, rare-token, ...) the last to be pruned?

    Within each (model, method), heads get a percentile rank of importance in (0, 1]
    (1 = most important = pruned last; ties share the mean rank). For each role: mean rank of
    heads with that role vs all other heads, their difference and a two-sided Mann-Whitney U
    p-value. head_roles: the `heads_classes` table (model, layer, head, role); a head may hold
    several roles. Returns model, method, role, n_role, n_other, mean_rank_role, mean_rank_other,
    diff, p_value.
    """
    imp = importance.copy()
    imp["rank"] = imp.groupby(["model", "method"])["value"].rank(pct=True, method="average")
    rows = []
    for (model, method), group in imp.groupby(["model", "method"], sort=False):
        roles = head_roles[head_roles["model"] == model]
        for role, members in roles.groupby("role", sort=True):
            keys = set(zip(members["layer"], members["head"]))
            is_role = np.array([(l, h) in keys for l, h in zip(group["layer"], group["head"])])
            inside, outside = group["rank"][is_role], group["rank"][~is_role]
            if len(inside) == 0:
                continue
            p = (float(stats.mannwhitneyu(inside, outside).pvalue)
                 if len(outside) > 0 else float("nan"))
            rows.append((model, method, role, len(inside), len(outside), float(inside.mean()),
                         float(outside.mean()) if len(outside) else float("nan"),
                         float(inside.mean() - outside.mean()) if len(outside) else float("nan"), p))
    return pd.DataFrame(rows, columns=["model", "method", "role", "n_role", "n_other",
                                       "mean_rank_role", "mean_rank_other", "diff", "p_value"])
