"""The multi-bootstrap: intervals over pretraining seeds AND test items (Sellam et al. 2022).

Sellam et al. 2022, "The MultiBERTs: BERT Reproductions for Robustness Analysis" (ICLR 2022, Sec. 3
and appendix) ask about a *training procedure*, not one checkpoint: a system is a distribution over
pretraining seeds, and its score is judged on a sample of test items. One bootstrap replicate
resamples both:

    seeds  s*_1..s*_S  drawn with replacement from the S pretraining seeds,
    items  i*_1..i*_N  drawn with replacement from the N test items,
    theta* = 1/S sum_k score(system seed s*_k on items i*),

and the interval is the (1-level)/2 and (1+level)/2 percentiles of theta* over B replicates. In a
comparison of two systems A and B the test items are shared, so one item resample per replicate is
applied to both (paired items); their seeds are unrelated (seed s of A has nothing to do with seed s
of B: the unpaired design), so each system's seeds are resampled independently.

Data layout, per system: `items` (S, N, 4) for S seeds and N test items, columns
[correct (0/1), tp, fp, fn]; per layer (S, L, N, 4). `metric` is "accuracy" (mean of column 0) or
"micro_f1" (2 sum tp / (2 sum tp + sum fp + sum fn) over columns 1:4, `probes.stats`).

Speed: an item resample only enters through per-item sums. With multinomial counts w (N,) (how often
each item was drawn), sum_{i in resample} x_i = w @ x, so a chunk of replicates is one matrix product
(B, N) @ (N, S*L*4), and both metrics are functions of those sums. Every layer of a replicate sees the
same seed and item resample, so curves are coherent.

- `multi_bootstrap`: the seed mean of a score (also items-only or seeds-only on request).
- `layer_curve`, `best_layer_score`, `expected_layer_delta` (E_delta of Tenney et al. 2019b): layers.
- `held_out_best`: the best layer chosen on held-out items (cross-fitting over two halves of the items,
  as `probes.layers.cross_fit_best` does for the main job), so that the best-layer score is not scored
  on the items that chose it.
- `compare`, `compare_e_delta`: A - B with paired items and independent seeds, a p-value, a claim, and
  seed-pair sign flips.
- `seeds_only`, `compare_seeds_only`: statistics with no test items (one scalar per seed).
- `holm`: Holm's (1979) step-down adjustment of a family of p-values.

Few seeds. A bootstrap of the mean of S values has the variance of the plug-in (divide-by-S) estimate,
(S - 1) / S of the unbiased one: with S = 2 the seed half of the interval is built on half the seed
variance, with 3 on two thirds, with 4 on three quarters. So no comparison is claimed with fewer than
`MIN_SEEDS` = 3 seeds a system (the interval is still given), and a caller marks claims made at 3 or
4 seeds (`FEW_SEEDS`).

p-values. A comparison's p-value is two-sided, from a Wald test whose standard error is the standard
deviation of the bootstrap replicates of delta: p = 2 Phi(-|delta| / sd(delta*)) (Efron & Tibshirani
1993, ch. 16; when the replicates are normal it is the level at which the percentile interval just
touches 0). Counting the replicates beyond 0 instead would floor p at about 2 / B, too coarse for a
family of a hundred comparisons (Holm's first threshold 0.05 / 100 needs B > 4,000 replicates per
comparison just to be reachable).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from scipy.stats import norm

from probes.layers import center_of_gravity, differential_scores
from probes.stats import micro_f1_from_counts

CHUNK_ELEMS = 4_000_000  # item-count matrix entries (replicates x N) drawn at once
MIN_SEEDS = 3   # fewest seeds a system for a claim on a statistic with seed variance (module docstring)
FEW_SEEDS = 5   # claims with fewer seeds than this (3 or 4) are marked: the seed variance is under-estimated


@dataclass(frozen=True)
class Interval:
    """A statistic on all seeds and all items (`value`, not the bootstrap mean) and its percentile
    interval [low, high]. `n_seeds` / `n_items` are the data's sizes (n_items = 0 when there are no
    items): with n_seeds < 2 the interval cannot cover seed variance and is not procedure-level."""

    value: float
    low: float
    high: float
    n_seeds: int
    n_items: int


@dataclass(frozen=True)
class Comparison:
    """delta = stat(A) - stat(B) on all seeds and items, its percentile interval, the share of
    replicates with delta* > 0, and the seed-pair check: of the n_seed_pairs pairs (seed i of A,
    seed j of B), `flips` is how many have score(A_i) - score(B_j) of another sign than `delta`.
    `claim` is "A > B" (low > 0), "B > A" (high < 0) or "no claim" (also whenever either system has
    fewer than `min_seeds` seeds). `p_value` is the two-sided Wald p-value with the bootstrap standard
    error (module docstring; nan when it cannot be formed); `n_seeds` the smaller system's seed count."""

    delta: float
    low: float
    high: float
    p_a_gt_b: float
    n_seed_pairs: int
    flips: int
    claim: str
    p_value: float = float("nan")
    n_seeds: int = 0


# ----------------------------------------------------------------------------- metrics
def _accuracy_from_sums(sums: np.ndarray, n: int) -> np.ndarray:
    """(..., 4) per-item column sums over n (resampled) items -> accuracy (...)."""
    return sums[..., 0] / n


def _micro_f1_from_sums(sums: np.ndarray, n: int) -> np.ndarray:
    """(..., 4) column sums -> micro-F1 (...); 1.0 where 2 tp + fp + fn = 0, as `micro_f1_from_counts`."""
    tp, fp, fn = sums[..., 1], sums[..., 2], sums[..., 3]
    d = 2 * tp + fp + fn
    return np.where(d > 0, 2 * tp / np.where(d > 0, d, 1.0), 1.0)


def _accuracy(items: np.ndarray) -> float:
    return float(items[:, 0].mean())


def _micro_f1(items: np.ndarray) -> float:
    return micro_f1_from_counts(items[:, 1:4])


# metric name -> (score of one (N, 4) array, vectorised score of column sums)
METRICS: dict[str, tuple[Callable[[np.ndarray], float], Callable[[np.ndarray, int], np.ndarray]]] = {
    "accuracy": (_accuracy, _accuracy_from_sums),
    "micro_f1": (_micro_f1, _micro_f1_from_sums),
}


def _metric(metric: str) -> tuple[Callable[[np.ndarray], float], Callable[[np.ndarray, int], np.ndarray]]:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {sorted(METRICS)}")
    return METRICS[metric]


def score(items: np.ndarray, metric: str = "accuracy") -> float:
    """The metric on one (N, 4) array [correct, tp, fp, fn]: accuracy = mean(correct), micro-F1 =
    2 sum tp / (2 sum tp + sum fp + sum fn)."""
    items = np.asarray(items, dtype=float)
    if items.ndim != 2 or items.shape[1] != 4 or items.shape[0] == 0:
        raise ValueError(f"score: items must have shape (N, 4) with N > 0, got {items.shape}")
    return _metric(metric)[0](items)


# ----------------------------------------------------------------------------- checks
def _check_args(n_boot: int, level: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")


def _as_items(items: np.ndarray, name: str) -> np.ndarray:
    """(S, N, 4) -> float array, or ValueError naming the shape."""
    x = np.asarray(items, dtype=float)
    if x.ndim != 3 or x.shape[-1] != 4 or 0 in x.shape:
        raise ValueError(f"{name}: expected shape (S seeds, N items, 4 columns) with S, N > 0, got {x.shape}")
    return x


def _as_layer_items(items: np.ndarray, name: str) -> np.ndarray:
    """(S, L, N, 4) -> float array, or ValueError naming the shape."""
    x = np.asarray(items, dtype=float)
    if x.ndim != 4 or x.shape[-1] != 4 or 0 in x.shape:
        raise ValueError(f"{name}: expected shape (S seeds, L layers, N items, 4 columns) with S, L, N > 0, "
                         f"got {x.shape}")
    return x


# ----------------------------------------------------------------------------- the engine
def _replicates(systems: Sequence[np.ndarray], metric: str, n_boot: int, seed: int, resample_seeds: bool,
                resample_items: bool, chunk_elems: int = CHUNK_ELEMS) -> list[np.ndarray]:
    """Per system (S_k, L, N, 4), the per-layer scores of its resampled seeds: (n_boot, S_k, L).

    All systems share N and one item resample per replicate (paired items); each system's seeds are
    drawn independently. Entry [b, k, l] is the score of seed s*_k (replicate b) at layer l on the
    replicate's items, from multinomial item counts w: sums = w @ items.
    """
    from_sums = _metric(metric)[1]
    n = systems[0].shape[2]
    # (N, S_k * L * 4) per system, so that one product gives every seed, layer and column
    flat = [x.transpose(2, 0, 1, 3).reshape(n, -1) for x in systems]
    rng = np.random.default_rng(seed)
    per_chunk = max(1, chunk_elems // n)
    out: list[list[np.ndarray]] = [[] for _ in systems]
    done = 0
    while done < n_boot:
        b = min(per_chunk, n_boot - done)
        seed_idx = [rng.integers(0, x.shape[0], size=(b, x.shape[0])) if resample_seeds
                    else np.broadcast_to(np.arange(x.shape[0]), (b, x.shape[0])) for x in systems]
        if resample_items:
            draws = rng.integers(0, n, size=(b, n)) + n * np.arange(b)[:, None]
            w = np.bincount(draws.ravel(), minlength=b * n).reshape(b, n).astype(float)  # (b, N)
        else:
            w = np.ones((1, n))
        for k, (x, f) in enumerate(zip(systems, flat)):
            sums = (w @ f).reshape(w.shape[0], *x.shape[:2], 4)  # (b or 1, S_k, L, 4)
            per_seed = np.broadcast_to(from_sums(sums, n), (b, *x.shape[:2]))  # (b, S_k, L)
            out[k].append(np.take_along_axis(per_seed, seed_idx[k][:, :, None], axis=1))
        done += b
    return [np.concatenate(o, axis=0) for o in out]


def _percentiles(boots: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of replicate values (B,); nan replicates are skipped, and if more than half
    are nan the interval is (nan, nan)."""
    ok = np.isfinite(boots)
    if 2 * (boots.size - ok.sum()) > boots.size or not ok.any():
        return float("nan"), float("nan")
    lo, hi = np.quantile(boots[ok], [0.5 - level / 2, 0.5 + level / 2])
    return float(lo), float(hi)


def _seed_scores(x: np.ndarray, metric: str) -> np.ndarray:
    """(S, L, N, 4) -> (S, L) scores on all items."""
    f = _metric(metric)[0]
    return np.array([[f(layer) for layer in s] for s in x])


def _claim(low: float, high: float) -> str:
    """The percentile interval's verdict; nan bounds make no claim."""
    if low > 0:
        return "A > B"
    if high < 0:
        return "B > A"
    return "no claim"


def _p_value(delta: float, boots: np.ndarray) -> float:
    """Two-sided p = 2 Phi(-|delta| / sd(finite replicates)); nan without a finite delta or spread, 0 for
    a non-zero delta whose replicates do not vary, 1 for delta = 0."""
    ok = boots[np.isfinite(boots)]
    if not np.isfinite(delta) or ok.size < 2 or 2 * ok.size < boots.size:
        return float("nan")
    sd = float(ok.std(ddof=1))
    if sd == 0.0:
        return 1.0 if delta == 0 else 0.0
    return float(2 * norm.sf(abs(delta) / sd))


def _flips(a_scores: np.ndarray, b_scores: np.ndarray, delta: float) -> int:
    """Pairs (i, j) with sign(a_i - b_j) != sign(delta): a tied pair counts against a non-zero delta,
    and every untied pair against delta = 0. Pairs with an undefined score (an E_delta of nan) and an
    undefined delta count none."""
    if not np.isfinite(delta):
        return 0
    diffs = a_scores[:, None] - b_scores[None, :]
    return int(((np.sign(diffs) != np.sign(delta)) & np.isfinite(diffs)).sum())


# ----------------------------------------------------------------------------- public API
def multi_bootstrap(items: np.ndarray, metric: str = "accuracy", *, n_boot: int = 1000, seed: int = 0,
                    level: float = 0.95, resample_seeds: bool = True, resample_items: bool = True) -> Interval:
    """Multi-bootstrap interval of the seed mean of `metric` (Sellam et al. 2022, Sec. 3).

    items (S, N, 4). value = 1/S sum_s score(items[s]). Each replicate resamples the seeds and the
    items with replacement (one item resample for every seed) and takes the mean over the resampled
    seeds of the score on the resampled items. resample_seeds=False gives the items-only bootstrap of
    the seed mean; resample_items=False the seeds-only one (both False: low = high = value).

    With S == 1 resampling seeds changes nothing: the result is an items-only interval, which says
    nothing about how another pretraining seed would score. It is returned anyway; `n_seeds` = 1 on
    the result marks it, and a caller should not report it as procedure-level.
    """
    _check_args(n_boot, level)
    x = _as_items(items, "multi_bootstrap")[:, None]  # (S, 1, N, 4)
    value = float(_seed_scores(x, metric).mean())
    (reps,) = _replicates([x], metric, n_boot, seed, resample_seeds, resample_items)
    lo, hi = _percentiles(reps[:, :, 0].mean(axis=1), level)
    return Interval(value, lo, hi, x.shape[0], x.shape[2])


def layer_curve(items: np.ndarray, metric: str = "accuracy", *, n_boot: int = 1000, seed: int = 0,
                level: float = 0.95, resample_seeds: bool = True, resample_items: bool = True) -> list[Interval]:
    """One multi-bootstrap interval per layer of items (S, L, N, 4).

    Every layer of a replicate uses the same seed and item resample, so the replicate curves are
    coherent (a layer that beats another on every item beats it in every replicate).
    """
    _check_args(n_boot, level)
    x = _as_layer_items(items, "layer_curve")
    values = _seed_scores(x, metric).mean(axis=0)  # (L,)
    (reps,) = _replicates([x], metric, n_boot, seed, resample_seeds, resample_items)
    curves = reps.mean(axis=1)  # (B, L)
    return [Interval(float(values[k]), *_percentiles(curves[:, k], level), x.shape[0], x.shape[2])
            for k in range(x.shape[1])]


def best_layer_score(items: np.ndarray, metric: str = "accuracy", *, n_boot: int = 1000, seed: int = 0,
                     level: float = 0.95, resample_seeds: bool = True, resample_items: bool = True) -> Interval:
    """max over layers of the seed-mean score, items (S, L, N, 4), with a multi-bootstrap interval.

    Per replicate: the maximum over layers of the replicate's per-layer seed-mean scores. This is the
    in-sample maximum (the layer is picked on the items it is scored on), so it is optimistic, and more
    so for a system with more layers or noisier ones; the zoo scores the layer chosen on held-out items
    instead (`held_out_best`).
    """
    _check_args(n_boot, level)
    x = _as_layer_items(items, "best_layer_score")
    value = float(_seed_scores(x, metric).mean(axis=0).max())
    (reps,) = _replicates([x], metric, n_boot, seed, resample_seeds, resample_items)
    return Interval(value, *_percentiles(reps.mean(axis=1).max(axis=1), level), x.shape[0], x.shape[2])


def _e_delta(curves: np.ndarray, layer_ids: Sequence[int] | None) -> np.ndarray:
    """(..., L) cumulative scores -> (...) E_delta via `differential_scores` and `center_of_gravity`."""
    flat = curves.reshape(-1, curves.shape[-1])
    out = np.array([center_of_gravity(differential_scores(c), layer_ids) for c in flat])
    return out.reshape(curves.shape[:-1])


def expected_layer_delta(cumulative: np.ndarray, metric: str = "accuracy", layer_ids: Sequence[int] | None = None,
                         *, n_boot: int = 1000, seed: int = 0, level: float = 0.95, resample_seeds: bool = True,
                         resample_items: bool = True) -> Interval:
    """E_delta (Tenney et al. 2019b) of cumulative probes, cumulative (S, L, N, 4), with a multi-bootstrap
    interval.

    Per seed: d_l = score(P(l)) - score(P(l-1)) (`differential_scores`), E_delta = sum_l l d_l / sum_l d_l
    (`center_of_gravity`, layers named by `layer_ids`, default 0..L-1); the statistic is the mean of the
    per-seed E_delta (E_delta per seed, then the mean over seeds, not E_delta of the mean curve). A
    replicate computes it on its resampled seeds' curves on its resampled items.

    E_delta is undefined (nan) when sum_l d_l <= 0. A seed with undefined E_delta makes the mean nan:
    such replicates are skipped, and if more than half of them are nan, low = high = nan.
    """
    _check_args(n_boot, level)
    x = _as_layer_items(cumulative, "expected_layer_delta")
    if layer_ids is not None and len(layer_ids) != x.shape[1]:
        raise ValueError(f"expected_layer_delta: {len(layer_ids)} layer_ids for {x.shape[1]} layers")
    value = float(_e_delta(_seed_scores(x, metric), layer_ids).mean())
    (reps,) = _replicates([x], metric, n_boot, seed, resample_seeds, resample_items)
    boots = _e_delta(reps, layer_ids).mean(axis=1)  # (B,)
    return Interval(value, *_percentiles(boots, level), x.shape[0], x.shape[2])


PerSeed = Callable[[np.ndarray], np.ndarray]   # per-layer scores (..., S, L) -> a statistic per seed (..., S)


def _compare(xa: np.ndarray, xb: np.ndarray, stat_a: PerSeed, stat_b: PerSeed, metric: str, n_boot: int, seed: int,
             level: float, min_seeds: int) -> Comparison:
    """A - B of the seed means of stat_a / stat_b on xa (S_a, L_a, N, 4) and xb (S_b, L_b, N, 4): one item
    resample per replicate for both, each system's seeds drawn on their own (`_replicates`)."""
    sa, sb = stat_a(_seed_scores(xa, metric)), stat_b(_seed_scores(xb, metric))
    delta = float(sa.mean() - sb.mean())
    ra, rb = _replicates([xa, xb], metric, n_boot, seed, True, True)
    boots = stat_a(ra).mean(axis=1) - stat_b(rb).mean(axis=1)   # (B,)
    lo, hi = _percentiles(boots, level)
    ok = np.isfinite(boots)
    n_seeds = min(xa.shape[0], xb.shape[0])
    claim = _claim(lo, hi) if n_seeds >= min_seeds else "no claim"
    return Comparison(delta, lo, hi, float((boots[ok] > 0).mean()) if ok.any() else float("nan"), sa.size * sb.size,
                      _flips(sa, sb, delta), claim, _p_value(delta, boots), n_seeds)


def _layer_zero(scores: np.ndarray) -> np.ndarray:
    return scores[..., 0]


def compare(a: np.ndarray, b: np.ndarray, metric: str = "accuracy", *, n_boot: int = 1000, seed: int = 0,
            level: float = 0.95, min_seeds: int = MIN_SEEDS) -> Comparison:
    """A - B on the seed-mean score, a (S_a, N, 4) and b (S_b, N, 4) on the same N test items
    (Sellam et al. 2022, paired items, unpaired seeds).

    Each replicate applies ONE item resample to both systems and resamples A's and B's seeds
    independently; delta* = mean over A's resampled seeds - mean over B's. p_a_gt_b is the share of
    replicates with delta* > 0, p_value the two-sided Wald p-value with the replicates' standard error.
    `flips` counts the seed pairs (A_i, B_j) whose difference on all items has another sign than
    `delta`; a claim with flips > 0 still stands, but a caller should flag it: some pairs of single
    checkpoints would have shown the opposite. With fewer than `min_seeds` seeds on either side the
    interval is given but no claim is made (module docstring). To compare one layer, slice it.
    """
    _check_args(n_boot, level)
    xa, xb = _as_items(a, "compare: a"), _as_items(b, "compare: b")
    if xa.shape[1] != xb.shape[1]:
        raise ValueError(f"compare: a and b must score the same test items, got a {xa.shape} and b {xb.shape}")
    return _compare(xa[:, None], xb[:, None], _layer_zero, _layer_zero, metric, n_boot, seed, level, min_seeds)


def compare_e_delta(a: np.ndarray, b: np.ndarray, metric: str = "accuracy", layer_ids_a: Sequence[int] | None = None,
                    layer_ids_b: Sequence[int] | None = None, *, n_boot: int = 1000, seed: int = 0,
                    level: float = 0.95, min_seeds: int = MIN_SEEDS) -> Comparison:
    """E_delta(A) - E_delta(B) of cumulative probes, a (S_a, L_a, N, 4) and b (S_b, L_b, N, 4) on the same
    N items, each the mean of its per-seed E_delta (`expected_layer_delta`), resampled as `compare`.
    Replicates where a resampled seed's E_delta is undefined are skipped (more than half: nan interval)."""
    _check_args(n_boot, level)
    xa, xb = _as_layer_items(a, "compare_e_delta: a"), _as_layer_items(b, "compare_e_delta: b")
    if xa.shape[2] != xb.shape[2]:
        raise ValueError(f"compare_e_delta: a and b must score the same test items, got a {xa.shape} and b {xb.shape}")
    for ids, x, side in ((layer_ids_a, xa, "a"), (layer_ids_b, xb, "b")):
        if ids is not None and len(ids) != x.shape[1]:
            raise ValueError(f"compare_e_delta: {len(ids)} layer_ids_{side} for {x.shape[1]} layers")
    return _compare(xa, xb, lambda s: _e_delta(s, layer_ids_a), lambda s: _e_delta(s, layer_ids_b), metric, n_boot,
                    seed, level, min_seeds)


def _as_values(values: Sequence[float], name: str) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or not np.all(np.isfinite(v)):
        raise ValueError(f"{name}: expected a 1-D sequence of finite per-seed values, got {v.tolist()}")
    return v


def _seed_means(v: np.ndarray, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """(n_boot,) means of seed resamples of v."""
    return v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1)


def seeds_only(values: Sequence[float], *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> Interval:
    """Percentile bootstrap of the mean of per-seed scalars (statistics with no test items: head-role
    counts, prunable fraction, finetuning gain): the seed half of the multi-bootstrap. With fewer than
    2 values low = high = nan (no seed variance to resample); with none, value is nan too."""
    _check_args(n_boot, level)
    v = _as_values(values, "seeds_only")
    if v.size < 2:
        return Interval(float(v.mean()) if v.size else float("nan"), float("nan"), float("nan"), v.size, 0)
    lo, hi = _percentiles(_seed_means(v, np.random.default_rng(seed), n_boot), level)
    return Interval(float(v.mean()), lo, hi, v.size, 0)


def compare_seeds_only(a_values: Sequence[float], b_values: Sequence[float], *, n_boot: int = 1000, seed: int = 0,
                       level: float = 0.95, min_seeds: int = MIN_SEEDS) -> Comparison:
    """mean(A) - mean(B) of per-seed scalars with independent seed resamples (unpaired seeds), as
    `compare` without items. With fewer than 2 values on either side low = high = p_a_gt_b = p_value = nan
    and the claim is "no claim"; `flips` is computed all the same. With fewer than `min_seeds` values on
    either side the interval is given but no claim is made: a bootstrap of two values has three
    possible means, two equal seeds would give a zero-width interval, and the bootstrap variance of a
    mean of S values is (S - 1) / S of the unbiased one (module docstring)."""
    _check_args(n_boot, level)
    a, b = _as_values(a_values, "compare_seeds_only: a"), _as_values(b_values, "compare_seeds_only: b")
    if a.size == 0 or b.size == 0:
        raise ValueError(f"compare_seeds_only: need values on both sides, got {a.size} and {b.size}")
    delta = float(a.mean() - b.mean())
    flips, n_seeds = _flips(a, b, delta), min(a.size, b.size)
    if n_seeds < 2:
        return Comparison(delta, float("nan"), float("nan"), float("nan"), a.size * b.size, flips, "no claim",
                          float("nan"), n_seeds)
    rng = np.random.default_rng(seed)
    boots = _seed_means(a, rng, n_boot) - _seed_means(b, rng, n_boot)
    lo, hi = _percentiles(boots, level)
    claim = _claim(lo, hi) if n_seeds >= min_seeds else "no claim"
    return Comparison(delta, lo, hi, float((boots > 0).mean()), a.size * b.size, flips, claim,
                      _p_value(delta, boots), n_seeds)


# ----------------------------------------------------------------------------- selection and families
def held_out_best(items: np.ndarray, metric: str = "accuracy") -> tuple[int, np.ndarray]:
    """The best layer chosen on held-out items, items (S, L, N, 4) -> (layer, (S, N, 4)).

    The procedure of `probes.layers.cross_fit_best` (the main job's "best" rows), scored with `metric`:
    split the N items into a first and a second half (items come in sentence order); on each half pick
    the layer with the best seed-mean score (ties -> the lower layer) and take the OTHER half's items
    at that layer. Every item is then scored at a layer chosen without it, so the maximum over layers
    does not over-state the score (the in-sample `best_layer_score` does). Returns the layer both
    halves chose, or -1 when they disagree, and the cross-fitted per-item counts, which the
    multi-bootstrap then resamples as any other (S, N, 4) array.
    """
    x = _as_layer_items(items, "held_out_best")
    n = x.shape[2]
    if n < 2:
        raise ValueError(f"held_out_best: need at least 2 test items to choose a layer on held-out items, got {n}")
    halves = [np.arange(n // 2), np.arange(n // 2, n)]
    picks = [int(np.argmax(_seed_scores(x[:, :, h], metric).mean(axis=0))) for h in halves]
    out = np.empty_like(x[:, 0])
    out[:, halves[1]] = x[:, picks[0]][:, halves[1]]   # chosen on the first half, scored on the second
    out[:, halves[0]] = x[:, picks[1]][:, halves[0]]
    return (picks[0] if picks[0] == picks[1] else -1), out


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values of one family: sorted p_(1) <= ... <= p_(m),
    adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); "claim where adj <= alpha" keeps the chance of
    any false claim in the family at most alpha whatever the dependence between the comparisons (they
    share systems and items). nan p-values are left out of the family and stay nan."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    m = order.size
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out
