"""Structural probes (Hewitt & Manning 2019, "A Structural Probe for Finding Syntax in Word
Representations"), following the authors' code (john-hewitt/structural-probes).

For the vectors h_i of one layer (X: (N_words, D), memmap welcome) and a rank-k linear map B (k, D):

    distance probe    d_B(i, j) = ||B (h_i - h_j)||^2     ~ path length between words i and j in the tree
    depth probe       ||h_i||_B = ||B h_i||^2             ~ depth of word i (root = 0)

    loss (distance)   mean over sentences of  sum_{i,j} |d_B(i, j) - d_T(i, j)| / n^2
    loss (depth)      mean over sentences of  sum_i |||h_i||_B - depth_T(i)| / n

(n = sentence length; every word is trained on, punctuation included, as in the reference code.)
B starts uniform in [-0.05, 0.05]; Adam (lr 1e-3), `batch_size` sentences per step, learning rate
x0.1 after every epoch whose validation loss does not improve (the reference's ReduceLROnPlateau,
patience 0; `lr_decay=None` switches it off) and early stopping after `patience` such epochs (an
improvement must exceed 1e-4, as in the reference), best epoch restored. Inputs are used raw (no
standardisation), as in the reference.

Data layout: X holds one row per word (global rows); a sentence is the rows [start, end) of `bounds`
(S, 2) and its `heads[s]`: the 0-based head position of each word *within the sentence*, -1 for the
root (one root, no cycle).

Evaluation (the reference's reporter.py):
- UUAS: per sentence, the minimum spanning tree (Prim's) of the predicted distances over the
  non-punctuation words, against the gold edges (i, head(i)) with both ends non-punctuation; corpus
  ratio (matched edges / gold edges, summed over sentences). The reference takes the gold edges from
  an MST of the gold distances over non-punctuation words: the same edges whenever punctuation words
  are leaves (nearly always in UD); here a punctuation word with dependents simply drops its edges.
- DSpr.: Spearman correlation between each word's row of predicted and gold distances, pooled over
  the sentences of one length, averaged per length, then averaged over lengths 5..50.
- Root accuracy: share of sentences whose least-deep non-punctuation word (first on ties) is the gold root.
- NSpr.: Spearman correlation between predicted and gold depths per sentence, averaged per sentence
  length and then over lengths 5..50.
Spearman and DSpr./NSpr. include punctuation words, as the reference does; `punct_mask` drops them
(the sentence length is then its number of non-punctuation words). A constant prediction has
correlation 0 (scipy would give nan).

Confidence intervals: each metric is a statistic of per-sentence items (`uuas_items`, `root_accuracy_items`,
`dspr_items`, `nspr_items`, the probes' `score_items`): UUAS the ratio of summed matched / gold edges, root
accuracy the mean of per-sentence hits, DSpr. / NSpr. the per-length means then their mean. With n_boot > 0,
`structural_layer_scores` gives each per-seed score the percentile bootstrap interval over test *sentences*
(`probes.stats.bootstrap_ci`), the unit the metrics are defined on; the seed = -1 row keeps the t interval
over seeds.

Where this differs from the paper: early stopping on held-out *training sentences* (`val_fraction`,
chosen by `seed`) rather than on the dev set.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path
from scipy.stats import rankdata
from torch import nn

from probes.edge import check_spans
from probes.estimator import LayeredData, OneLayerEstimator
from probes.layers import PROBING_COLUMNS, LayerResult, _frame, _seed_aggregates
from probes.stats import bootstrap_ci

_PRED_SENTENCES = 256  # sentences per batch at inference
_MIN_DELTA = 1e-4      # a validation loss must improve by this much (reference: 0.0001)
SPEARMAN_LENGTHS = (5, 50)
# (per-sentence items, statistic): a metric is statistic(items); the bootstrap resamples the rows of items
SentenceItems = tuple[np.ndarray, Callable[[np.ndarray], float]]


# ----------------------------------------------------------------------------- trees
def _check_heads(heads: Any, where: str = "heads") -> np.ndarray:
    h = np.asarray(heads)
    if h.ndim != 1 or (h.size and not np.issubdtype(h.dtype, np.integer)):
        raise ValueError(f"{where}: expected a 1-D int array of head positions (-1 for the root), got {h.dtype} {h.shape}")
    if h.size == 0:
        raise ValueError(f"{where}: empty sentence")
    h = h.astype(np.int64)
    n = len(h)
    bad = np.flatnonzero((h < -1) | (h >= n) | (h == np.arange(n)))
    if bad.size:
        i = bad[0]
        raise ValueError(f"{where}: word {i} has head {h[i]}, expected -1 (root) or another word in [0, {n})")
    roots = np.flatnonzero(h == -1)
    if roots.size != 1:
        raise ValueError(f"{where}: expected exactly one root (head -1), found {roots.size}"
                         + (f" (words {roots.tolist()})" if roots.size else ""))
    return h


def tree_depths(heads: Any, where: str = "heads") -> np.ndarray:
    """(n,) int depth of each word: number of arcs to the root (root = 0). ValueError on a cycle / no root."""
    h = _check_heads(heads, where)
    n = len(h)
    depth = np.full(n, -1, dtype=np.int64)
    depth[h == -1] = 0
    for i in range(n):
        path, j = [], i
        while depth[j] < 0:
            if j in path:
                raise ValueError(f"{where}: word {i} does not reach the root: cycle through word {j}")
            path.append(j)
            j = h[j]
        for k, w in enumerate(reversed(path), 1):
            depth[w] = depth[j] + k
    return depth


def tree_distances(heads: Any, where: str = "heads") -> np.ndarray:
    """(n, n) int path lengths in the undirected tree given by heads (0-based, -1 root)."""
    h = _check_heads(heads, where)
    tree_depths(h, where)  # cycle / root check
    n = len(h)
    child = np.flatnonzero(h >= 0)
    graph = csr_matrix((np.ones(len(child)), (child, h[child])), shape=(n, n))
    return shortest_path(graph, directed=False, unweighted=True).astype(np.int64)


# ----------------------------------------------------------------------------- input checks
def _check_sentences(n_words: int, bounds: Any, heads: Any = None, where: str = "") -> tuple:
    """bounds (S, 2) [start, end) rows; heads: S int arrays of the sentences' lengths, or None."""
    b = np.asarray(bounds)
    if b.ndim != 2 or len(b) == 0:
        raise ValueError(f"{where}bounds: expected an int array (S, 2) of sentence rows [start, end), "
                         f"got shape {b.shape}")
    b = check_spans(b, n_words, f"{where}bounds")
    if heads is None:
        return b, None
    if len(heads) != len(b):
        raise ValueError(f"{where}heads: has {len(heads)} sentences but bounds has {len(b)}")
    out = []
    for s, (h, (start, end)) in enumerate(zip(heads, b)):
        h = _check_heads(h, f"{where}heads[{s}]")
        if len(h) != end - start:
            raise ValueError(f"{where}heads[{s}]: has {len(h)} words but bounds[{s}] spans {end - start} rows")
        out.append(h)
    return b, out


def _check_masks(punct_mask: Any, lengths: Sequence[int], name: str = "punct_mask") -> list[np.ndarray]:
    if punct_mask is None:
        return [np.zeros(n, dtype=bool) for n in lengths]
    if len(punct_mask) != len(lengths):
        raise ValueError(f"{name}: has {len(punct_mask)} sentences but there are {len(lengths)}")
    out = []
    for s, (m, n) in enumerate(zip(punct_mask, lengths)):
        m = np.asarray(m)
        if m.shape != (n,) or m.dtype != bool:
            raise ValueError(f"{name}[{s}]: expected a bool array of shape ({n},), got {m.dtype} {m.shape}")
        out.append(m)
    return out


# ----------------------------------------------------------------------------- estimators
class _StructuralProbe(OneLayerEstimator):
    """Shared fit / predict of the distance and depth probes (subclasses set _kind)."""

    _kind = ""
    _PARAMS = ("rank", "lr", "max_epochs", "patience", "batch_size", "val_fraction", "lr_decay", "seed", "device")

    def __init__(self, rank: int = 128, lr: float = 1e-3, max_epochs: int = 30, patience: int = 3,
                 batch_size: int = 20, val_fraction: float = 0.1, lr_decay: float | None = 0.1, seed: int = 0,
                 device: str = "cpu") -> None:
        self.rank, self.lr, self.max_epochs, self.patience = rank, lr, max_epochs, patience
        self.batch_size, self.val_fraction, self.lr_decay = batch_size, val_fraction, lr_decay
        self.seed, self.device = seed, device

    # ---- batching
    def _batch(self, layer: np.ndarray, bounds: np.ndarray, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) float32 and mask (B, T) of sentences `ids`."""
        start, lens = bounds[ids, 0], bounds[ids, 1] - bounds[ids, 0]
        offs = np.arange(int(lens.max()))
        mask = offs[None, :] < lens[:, None]
        rows = np.where(mask, start[:, None] + offs[None, :], start[:, None]).ravel()
        x = np.asarray(layer[rows], dtype=np.float32).reshape(len(ids), len(offs), -1)
        dev = torch.device(self.device)
        return torch.from_numpy(x).to(dev), torch.from_numpy(mask).to(dev)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, T) squared distances or (B, T) squared norms under B."""
        p = x @ self.B_.T                                                  # (B, T, k)
        sq = (p * p).sum(-1)
        if self._kind == "depth":
            return sq
        return sq[:, :, None] + sq[:, None, :] - 2 * p @ p.transpose(1, 2)

    def _gold(self, golds: list[np.ndarray], ids: np.ndarray, T: int) -> torch.Tensor:
        """Padded gold depths (B, T) or distances (B, T, T) of sentences `ids`."""
        g = np.zeros((len(ids),) + (T,) * golds[0].ndim, dtype=np.float32)
        for b, s in enumerate(ids):
            g[(b,) + tuple(slice(0, len(golds[s])) for _ in range(golds[s].ndim))] = golds[s]
        return torch.from_numpy(g).to(torch.device(self.device))

    def _loss(self, layer, bounds, golds, ids) -> torch.Tensor:
        """Sum over sentences `ids` of the length-normalised L1 loss."""
        x, mask = self._batch(layer, bounds, ids)
        pred, gold = self._forward(x), self._gold(golds, ids, x.shape[1])
        m = mask.float()
        n = m.sum(1)
        if self._kind == "depth":
            return ((pred - gold).abs() * m).sum(1).div(n).sum()
        return ((pred - gold).abs() * m[:, :, None] * m[:, None, :]).sum((1, 2)).div(n * n).sum()

    # ---- training
    def fit(self, X: Any, bounds: Any, heads: Sequence[Any]) -> "_StructuralProbe":
        """X: one layer (N_words, D); bounds (S, 2) sentence rows [start, end); heads: S int arrays (within-sentence
        0-based head positions, -1 for the root)."""
        for attr in [a for a in vars(self) if a.endswith("_")]:
            delattr(self, attr)
        if not isinstance(self.rank, (int, np.integer)) or self.rank < 1:
            raise ValueError(f"rank: expected a positive int, got {self.rank!r}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction: expected a value in [0, 1), got {self.val_fraction}")
        layer = self._layer(X)
        bounds, heads = _check_sentences(layer.shape[0], bounds, heads, "fit: ")
        self.d_in_ = layer.shape[1]
        golds = [tree_depths(h) if self._kind == "depth" else tree_distances(h) for h in heads]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.B_ = nn.Parameter(torch.empty(int(self.rank), self.d_in_, device=self.device).uniform_(-0.05, 0.05))
            rng = np.random.default_rng(self.seed)
            perm = rng.permutation(len(bounds))
            n_val = int(round(self.val_fraction * len(bounds))) if len(bounds) >= 20 else 0
            self._train(layer, bounds, golds, perm[n_val:], np.sort(perm[:n_val]), rng)
        return self

    def _train(self, layer, bounds, golds, train_ids, val_ids, rng) -> None:
        opt = torch.optim.Adam([self.B_], lr=self.lr)
        sched = (torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=self.lr_decay, patience=0)
                 if self.lr_decay and len(val_ids) else None)
        best, best_B, bad = float("inf"), None, 0
        self.history_, self.best_epoch_, self.n_epochs_ = [], -1, 0
        for epoch in range(self.max_epochs):
            order = train_ids[rng.permutation(len(train_ids))]
            for s in range(0, len(order), self.batch_size):
                ids = order[s:s + self.batch_size]
                loss = self._loss(layer, bounds, golds, ids) / len(ids)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            self.n_epochs_ = epoch + 1
            if len(val_ids) == 0:
                continue
            with torch.no_grad():
                val = sum(float(self._loss(layer, bounds, golds, val_ids[s:s + _PRED_SENTENCES]))
                          for s in range(0, len(val_ids), _PRED_SENTENCES)) / len(val_ids)
            self.history_.append(val)
            if sched is not None:
                sched.step(val)
            if val < best - _MIN_DELTA:
                best, best_B, bad, self.best_epoch_ = val, self.B_.detach().clone(), 0, epoch
            else:
                bad += 1
                if bad >= self.patience:
                    break
        if best_B is not None:
            with torch.no_grad():
                self.B_.copy_(best_B)

    # ---- inference
    @torch.no_grad()
    def _predict(self, X: Any, bounds: Any) -> list[np.ndarray]:
        if not hasattr(self, "B_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet; call fit first")
        layer = self._layer(X)
        bounds, _ = _check_sentences(layer.shape[0], bounds)
        out: list[np.ndarray] = []
        for s in range(0, len(bounds), _PRED_SENTENCES):
            ids = np.arange(s, min(len(bounds), s + _PRED_SENTENCES))
            x, _ = self._batch(layer, bounds, ids)
            pred = self._forward(x).clamp_min(0).cpu().numpy().astype(np.float64)
            for b, i in enumerate(ids):
                n = int(bounds[i, 1] - bounds[i, 0])
                out.append(pred[b, :n] if self._kind == "depth" else pred[b, :n, :n])
        if self._kind == "distance":
            for d in out:
                np.fill_diagonal(d, 0.0)
        return out


class DistanceProbe(_StructuralProbe):
    """Structural distance probe: ||B (h_i - h_j)||^2 fitted to tree path lengths (L1, / n^2 per sentence).

    fit(X, bounds, heads) -> self; predict_distances(X, bounds) -> list of (n, n) arrays.
    Learned: B_ (rank, D), d_in_, n_epochs_, best_epoch_, history_ (validation loss per epoch)."""

    _kind = "distance"

    def predict_distances(self, X: Any, bounds: Any) -> list[np.ndarray]:
        """Predicted squared distances per sentence, (n, n), symmetric, zero diagonal."""
        return self._predict(X, bounds)

    def score_items(self, X: Any, bounds: Any, heads: Sequence[Any], punct_mask: Any = None) -> dict[str, SentenceItems]:
        """{"uuas", "dspr"}: (per-sentence items, statistic) on the given sentences (`uuas_items`, `dspr_items`;
        DSpr. counts punctuation words, as the reference does)."""
        pred = self.predict_distances(X, bounds)
        return {"uuas": uuas_items(pred, heads, punct_mask), "dspr": dspr_items(pred, heads)}

    def score(self, X: Any, bounds: Any, heads: Sequence[Any], punct_mask: Any = None) -> dict[str, float]:
        """{"uuas", "dspr"} on the given sentences."""
        return {k: stat(items) for k, (items, stat) in self.score_items(X, bounds, heads, punct_mask).items()}


class DepthProbe(_StructuralProbe):
    """Structural depth probe: ||B h_i||^2 fitted to tree depths (L1, / n per sentence).

    fit(X, bounds, heads) -> self; predict_depths(X, bounds) -> list of (n,) arrays.
    Learned: B_ (rank, D), d_in_, n_epochs_, best_epoch_, history_ (validation loss per epoch)."""

    _kind = "depth"

    def predict_depths(self, X: Any, bounds: Any) -> list[np.ndarray]:
        """Predicted squared norms per sentence, (n,)."""
        return self._predict(X, bounds)

    def score_items(self, X: Any, bounds: Any, heads: Sequence[Any], punct_mask: Any = None) -> dict[str, SentenceItems]:
        """{"root_acc", "nspr"}: (per-sentence items, statistic) on the given sentences (`root_accuracy_items`,
        `nspr_items`; NSpr. counts punctuation words, as the reference does)."""
        pred = self.predict_depths(X, bounds)
        return {"root_acc": root_accuracy_items(pred, heads, punct_mask), "nspr": nspr_items(pred, heads)}

    def score(self, X: Any, bounds: Any, heads: Sequence[Any], punct_mask: Any = None) -> dict[str, float]:
        """{"root_acc", "nspr"} on the given sentences."""
        return {k: stat(items) for k, (items, stat) in self.score_items(X, bounds, heads, punct_mask).items()}


# ----------------------------------------------------------------------------- metrics
def _pairs_check(pred: Sequence[Any], heads: Sequence[Any], name: str, ndim: int) -> tuple[list, list]:
    if len(pred) != len(heads):
        raise ValueError(f"{name}: has {len(pred)} sentences but heads has {len(heads)}")
    if len(pred) == 0:
        raise ValueError(f"{name}: no sentences given")
    P, H = [], []
    for s, (p, h) in enumerate(zip(pred, heads)):
        h = _check_heads(h, f"heads[{s}]")
        p = np.asarray(p, dtype=np.float64)
        if p.shape != (len(h),) * ndim:
            raise ValueError(f"{name}[{s}]: expected shape {(len(h),) * ndim} (the sentence's length), got {p.shape}")
        P.append(p)
        H.append(h)
    return P, H


def mst_edges(dist: np.ndarray) -> set[tuple[int, int]]:
    """Edges (i < j) of a minimum spanning tree of a dense symmetric (n, n) matrix (Prim's, from word 0;
    ties -> the lowest index)."""
    n = len(dist)
    if n < 2:
        return set()
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    best, parent = dist[0].astype(np.float64).copy(), np.zeros(n, dtype=np.int64)
    edges = set()
    for _ in range(n - 1):
        cand = np.where(in_tree, np.inf, best)
        j = int(np.argmin(cand))
        edges.add((min(j, int(parent[j])), max(j, int(parent[j]))))
        in_tree[j] = True
        closer = ~in_tree & (dist[j] < best)
        best[closer], parent[closer] = dist[j][closer], j
    return edges


# Each metric is a statistic of per-sentence items, so that the bootstrap of structural_layer_scores can resample
# whole test sentences: `<metric>_items` returns (items, statistic) (SentenceItems), one row of items per sentence
# the metric is defined on, and the metric itself is statistic(items) (one definition for the point value and the
# resamples).

def _ratio_of_sums(items: np.ndarray) -> float:
    """items (S, 2) int (matched edges, gold edges) per sentence -> sum matched / sum gold (nan if no gold edge)."""
    hit, total = int(items[:, 0].sum()), int(items[:, 1].sum())
    return hit / total if total else float("nan")


def _mean(items: np.ndarray) -> float:
    """items (S,) -> their mean (nan if none)."""
    return float(np.mean(items)) if len(items) else float("nan")


def _length_average(items: np.ndarray, per_word: bool) -> float:
    """items (S, 1 + w): a sentence's length n in column 0, then its values (n of them if per_word, else one;
    nan padding after) -> mean of the values of each length, then mean over the lengths (nan if none).
    Lengths are taken in order of first appearance and values in row order, as a running list per length
    would hold them, so the point value is the same float as pooling the values sentence by sentence."""
    n = items[:, 0]
    means = [np.mean(items[n == k, 1:1 + (int(k) if per_word else 1)].ravel()) for k in dict.fromkeys(n.tolist())]
    return float(np.mean(means)) if means else float("nan")


def _padded(rows: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """(S, 1 + max values) float: length, then the values, nan padded."""
    out = np.full((len(rows), 1 + max((len(v) for _, v in rows), default=0)), np.nan)
    for r, (n, v) in enumerate(rows):
        out[r, 0], out[r, 1:1 + len(v)] = n, v
    return out


def uuas_items(pred_distances: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None) -> SentenceItems:
    """UUAS as (items (S', 2) int: matched and gold edges per sentence with a gold edge, ratio of their sums)."""
    P, H = _pairs_check(pred_distances, heads, "pred_distances", 2)
    masks = _check_masks(punct_mask, [len(h) for h in H])
    rows = []
    for p, h, m in zip(P, H, masks):
        keep = np.flatnonzero(~m)
        gold = {(min(i, int(h[i])), max(i, int(h[i]))) for i in keep if h[i] >= 0 and not m[h[i]]}
        pred = {(int(keep[a]), int(keep[b])) for a, b in mst_edges(p[np.ix_(keep, keep)])}
        if gold:        # a sentence without a gold edge adds nothing to either sum
            rows.append((len(gold & pred), len(gold)))
    return np.array(rows, dtype=np.int64).reshape(-1, 2), _ratio_of_sums


def uuas(pred_distances: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None) -> float:
    """Undirected unlabelled attachment score of the MST of predicted distances over non-punctuation words,
    against the gold edges between non-punctuation words; corpus ratio matched / gold edges."""
    items, statistic = uuas_items(pred_distances, heads, punct_mask)
    return statistic(items)


def root_accuracy_items(pred_depths: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None) -> SentenceItems:
    """Root accuracy as (items (S',) bool: root found, per sentence with a non-punctuation word; their mean)."""
    P, H = _pairs_check(pred_depths, heads, "pred_depths", 1)
    masks = _check_masks(punct_mask, [len(h) for h in H])
    ok = []
    for p, h, m in zip(P, H, masks):
        keep = np.flatnonzero(~m)
        if keep.size:
            ok.append(keep[int(np.argmin(p[keep]))] == int(np.flatnonzero(h == -1)[0]))
    return np.array(ok, dtype=bool), _mean


def root_accuracy(pred_depths: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None) -> float:
    """Share of sentences whose least-deep non-punctuation word (first on ties) is the gold root
    (sentences without a non-punctuation word are skipped)."""
    items, statistic = root_accuracy_items(pred_depths, heads, punct_mask)
    return statistic(items)


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row of a with the same row of b (average ranks); 0 for a constant row."""
    ra, rb = rankdata(a, axis=-1), rankdata(b, axis=-1)
    ra = ra - ra.mean(-1, keepdims=True)
    rb = rb - rb.mean(-1, keepdims=True)
    den = np.sqrt((ra * ra).sum(-1) * (rb * rb).sum(-1))
    num = (ra * rb).sum(-1)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def dspr_items(pred_distances: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None,
               lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> SentenceItems:
    """DSpr. as (items (S', 1 + w) float: per sentence of length n in lengths[0]..lengths[1], n then the Spearman
    of each of its n rows, nan padded; mean per length over all rows, then over lengths)."""
    P, H = _pairs_check(pred_distances, heads, "pred_distances", 2)
    masks = _check_masks(punct_mask, [len(h) for h in H])
    lo, hi = lengths
    rows = []
    for p, h, m in zip(P, H, masks):
        keep = np.flatnonzero(~m)
        if keep.size < 2 or not lo <= keep.size <= hi:
            continue
        gold = tree_distances(h)[np.ix_(keep, keep)]
        rows.append((keep.size, _spearman_rows(p[np.ix_(keep, keep)], gold)))
    return _padded(rows), partial(_length_average, per_word=True)


def dspr(pred_distances: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None,
         lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """The paper's DSpr.: Spearman of each word's predicted vs gold distance row, averaged per sentence length
    (all rows of all sentences of that length), then over lengths lengths[0]..lengths[1] (nan if none)."""
    items, statistic = dspr_items(pred_distances, heads, punct_mask, lengths)
    return statistic(items)


def nspr_items(pred_depths: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None,
               lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> SentenceItems:
    """NSpr. as (items (S', 2) float: length n in lengths[0]..lengths[1] and Spearman per sentence; mean per
    length, then over lengths)."""
    P, H = _pairs_check(pred_depths, heads, "pred_depths", 1)
    masks = _check_masks(punct_mask, [len(h) for h in H])
    lo, hi = lengths
    rows = []
    for p, h, m in zip(P, H, masks):
        keep = np.flatnonzero(~m)
        if keep.size < 2 or not lo <= keep.size <= hi:
            continue
        rows.append((keep.size, float(_spearman_rows(p[keep], tree_depths(h)[keep]))))
    return np.array(rows, dtype=np.float64).reshape(-1, 2), partial(_length_average, per_word=False)


def nspr(pred_depths: Sequence[Any], heads: Sequence[Any], punct_mask: Any = None,
         lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> float:
    """The paper's NSpr.: Spearman of predicted vs gold depths per sentence, averaged per sentence length,
    then over lengths lengths[0]..lengths[1] (nan if none)."""
    items, statistic = nspr_items(pred_depths, heads, punct_mask, lengths)
    return statistic(items)


# ----------------------------------------------------------------------------- layer-wise analysis
@dataclass(frozen=True)
class StructuralData(LayeredData):
    """One split: X per layer ((L+1, N_words, D) array or list of (N_words, D) memmaps), bounds (S, 2)
    sentence rows [start, end), heads: S int arrays (0-based within the sentence, -1 root), punct_mask:
    S bool arrays (True = punctuation, excluded from UUAS / root accuracy) or None."""

    X: Any
    bounds: Any
    heads: Sequence[Any]
    punct_mask: Any = None


STRUCTURAL_TASKS = {"structural_distance": (DistanceProbe, "distance"), "structural_depth": (DepthProbe, "depth")}
# the metric of each task that per-item counts carry (`item_counts`): UUAS, root accuracy
ITEM_METRICS = {"structural_distance": "uuas", "structural_depth": "root_acc"}


def item_counts(metric: str, items: np.ndarray) -> np.ndarray:
    """Per-sentence items of `uuas` or `root_acc` as (N, 4) [correct, tp, fp, fn] counts whose
    micro-F1 2 tp / (2 tp + fp + fn) is the metric, so the edge probes' item statistics (the
    multi-bootstrap of `probes.multibootstrap`) read them unchanged. UUAS: tp = matched edges,
    fp = fn = gold edges - matched (the MST has as many edges as the gold tree), correct = the
    sentence's own UUAS; root accuracy: tp = correct = 1 if the root is found, fp = fn = 1 - tp."""
    items = np.asarray(items, dtype=np.float64)
    if metric == "uuas":
        matched, gold = items[:, 0], items[:, 1]
        return np.stack([matched / gold, matched, gold - matched, gold - matched], 1)
    if metric == "root_acc":
        return np.stack([items, items, 1.0 - items, 1.0 - items], 1)
    raise ValueError(f"metric: expected one of {sorted(ITEM_METRICS.values())}, got {metric!r}")


def structural_layer_scores(train: StructuralData, test: StructuralData, *, layers: Sequence[int] | None = None,
                            rank: int | None = None, seeds: Sequence[int] = (0,), model: str = "",
                            task: str = "structural_distance", probe_params: dict | None = None,
                            n_boot: int = 0, boot_seed: int = 0, items_out: dict | None = None) -> LayerResult:
    """One structural probe per layer and seed (mode "single"), rows in PROBING_COLUMNS: metrics "uuas" and
    "dspr" for task "structural_distance", "root_acc" and "nspr" for "structural_depth"; with more than
    one seed a seed = -1 mean row per metric (t interval over seeds).

    With n_boot > 0 each per-seed row's ci_low / ci_high is the 95% percentile bootstrap interval over test
    *sentences* (`probes.stats.bootstrap_ci` on the probe's `score_items`), drawn with seed boot_seed + the
    probe's seed (boot_seed = 0: the probe's seed, as the other probes do); with n_boot = 0 they are nan.
    `items_out` (a dict) receives {("single", layer, seed): (N, 4) counts} of the task's `ITEM_METRICS`
    metric per test sentence (`item_counts`), as the edge probes' `items_out`."""
    if task not in STRUCTURAL_TASKS:
        raise ValueError(f"task: expected one of {sorted(STRUCTURAL_TASKS)}, got {task!r}")
    if n_boot < 0:
        raise ValueError(f"n_boot: expected an int >= 0, got {n_boot}")
    cls, probe = STRUCTURAL_TASKS[task]
    params = dict(probe_params or {})
    if rank is not None:
        params["rank"] = rank
    layers = list(range(train.n_layers)) if layers is None else list(layers)
    rows: list[dict] = []
    for l in layers:
        base = {"model": model, "task": task, "probe": probe, "pooling": "first", "layer": l, "mode": "single"}
        for seed in seeds:
            p = cls(**{**params, "seed": seed}).fit(train.layer(l), train.bounds, train.heads)
            for metric, (items, stat) in p.score_items(test.layer(l), test.bounds, test.heads, test.punct_mask).items():
                if n_boot > 0 and len(items):
                    value, lo, hi = bootstrap_ci(items, stat, n_boot=n_boot, seed=boot_seed + seed)
                else:       # no interval asked for, or no sentence the metric is defined on (value nan)
                    value, lo, hi = stat(items), float("nan"), float("nan")
                rows.append({**base, "metric": metric, "value": value, "seed": seed, "ci_low": lo, "ci_high": hi})
                if items_out is not None and metric == ITEM_METRICS[task]:
                    items_out[("single", l, seed)] = item_counts(metric, items)
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS))
