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
improvement must exceed 1e-4, as in the reference), best epoch restored.
`fit_probes` fits the probes of several inputs on the same sentences (a model's layers) together: one seed
gives them the same initial B, validation sentences and batch order, so each step projects every input's batch
in one batched product, while each probe keeps its own Adam, learning-rate decay and early stopping (the same
fit as its own `fit`, to float32 rounding). A batch projects only its sentences' words; the distance loss
reads them in blocks of `_GRAM_SENTENCES` sentences of similar length, so the (T, T) block of a short sentence
is not padded to the batch's longest.

Standardisation (`standardize=True`, the default; not in the reference, which reads the vectors raw): each
feature is z-scored, h -> (h - mean) / std, with the mean and std of the training sentences' words
(`probes.edge.span_word_stats` over the rows of `bounds`; learned as mean_, scale_; a feature with no spread
keeps scale 1), fixed at fit and applied to every split. The probe's training (the uniform init of B, Adam's
steps, the L1 loss against path lengths of 1..n) is not invariant to the scale of its inputs: a layer whose
vectors are 300 times longer, or shifted far from the origin, would otherwise start from distances 10^5
times the targets. Standardised, every layer and every model starts from the same place, as the edge probe
with `standardize` and the arc probe do. `standardize=False` is the reference's raw reading.

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

Floors (`STRUCTURAL_BASELINES`, `structural_baseline_scores`; rows of mode = the floor's name, layer -1), each
scored by the same metrics and per-sentence bootstrap as the probe: "random_tree", a uniformly drawn spanning
tree of the non-punctuation words (`uniform_tree`: UUAS 2/m, root accuracy 1/m in expectation for m scored
words); "chain", each word joined to the next and the first word the root; "position", the same probe fitted
on one-hot features of the word's index alone (`position_features`). The fourth, "random_init" (the same
architecture with fresh weights), is `structural_layer_scores(..., mode="random_init")` on that model's vectors.

Where this differs from the paper: early stopping on held-out *training sentences* (`val_fraction`,
chosen by `seed`) rather than on the dev set.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn

from probes.edge import check_spans, span_word_stats
from probes.estimator import LayeredData, OneLayerEstimator
from probes.layers import PROBING_COLUMNS, LayerResult, _frame, _seed_aggregates
from probes.stats import bootstrap_ci

_PRED_SENTENCES = 256  # sentences per batch at inference
_GRAM_SENTENCES = 5    # sentences of similar length per padded (T, T) block of the distance loss
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
    """(n, n) int path lengths in the undirected tree given by heads (0-based, -1 root). Row by row from the
    root down: a word is one step further than its head from every word outside its own subtree, and one step
    closer to every word inside it."""
    h = _check_heads(heads, where)
    depth = tree_depths(h, where)  # cycle / root check
    n = len(h)
    below = np.zeros((n, n), dtype=bool)     # below[i, a]: i is a or in a's subtree
    word, up = np.arange(n), np.arange(n)
    while word.size:
        below[word, up] = True
        up = h[up]
        word, up = word[up >= 0], up[up >= 0]
    step = np.where(below, -1, 1)
    dist = np.empty((n, n), dtype=np.int64)
    order = np.argsort(depth, kind="stable")
    dist[order[0]] = depth
    for c in order[1:].tolist():
        dist[c] = dist[h[c]] + step[:, c]
    return dist


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
def _sentence_rows(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """(sum(lens),) int64: the indices start, ..., start + len - 1 of every (start, len), concatenated in order."""
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    return np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()), dtype=np.int64)


@dataclass(frozen=True)
class _Sentences:
    """Sentences as the probes' steps read them: x (A, N, D) float32, for each of A inputs (layers) the
    sentences' rows one after another; off / lens (S,) each sentence's first row and its length; gold
    (float32, flat): the gold depths (one per row) or each sentence's (n, n) path lengths row-major, sentence
    after sentence, each sentence's first entry at gold_off (S,); both None at prediction."""

    x: torch.Tensor
    off: np.ndarray
    lens: np.ndarray
    gold: torch.Tensor | None = None
    gold_off: np.ndarray | None = None


def _read_sentences(layers: Sequence[np.ndarray], moments: Sequence[tuple | None], bounds: np.ndarray,
                    golds: Sequence[np.ndarray] | None, device: str) -> _Sentences:
    """The sentences of `bounds` from each layer (memmaps welcome), read once, each standardised with its
    (mean, scale) when given, with the gold depths / distances flattened when given."""
    lens = bounds[:, 1] - bounds[:, 0]
    rows = _sentence_rows(bounds[:, 0], lens)
    x = np.empty((len(layers), len(rows), layers[0].shape[1]), dtype=np.float32)
    for a, (layer, mom) in enumerate(zip(layers, moments)):
        x[a] = layer[rows]
        if mom is not None:     # standardize: the training words' moments (fit), applied to every split
            x[a] = (x[a] - mom[0]) / mom[1]
    dev, off = torch.device(device), np.cumsum(lens) - lens
    if golds is None:
        return _Sentences(torch.from_numpy(x).to(dev), off, lens)
    gold = torch.from_numpy(np.concatenate([np.ravel(g) for g in golds]).astype(np.float32)).to(dev)
    sizes = np.array([np.size(g) for g in golds], dtype=np.int64)        # n (depth) or n^2 (distance)
    return _Sentences(torch.from_numpy(x).to(dev), off, lens, gold, np.cumsum(sizes) - sizes)


def _pred_block(kind: str, data: _Sentences, ids: np.ndarray, B: torch.Tensor, inputs: torch.Tensor | None = None
            ) -> torch.Tensor:
    """(A, S_b, T, T) squared distances or (A, S_b, T) squared norms of sentences `ids` (T = the longest;
    padding entries are 0 and belong to no sentence) under B (A, k, D), input a reading inputs[a] of data.x
    (default: all). Only the sentences' own rows are projected."""
    lens = data.lens[ids]
    S_b, T = len(ids), int(lens.max())
    rows = torch.from_numpy(_sentence_rows(data.off[ids], lens))
    x = data.x[:, rows] if inputs is None else data.x[inputs[:, None], rows[None, :]]     # (A, N_b, D)
    p = torch.bmm(x, B.transpose(1, 2))                                                  # (A, N_b, k)
    slot = torch.from_numpy(_sentence_rows(np.arange(S_b) * T, lens))                   # row -> b * T + i
    p = p.new_zeros(len(B), S_b * T, p.shape[2]).index_copy(1, slot, p).view(len(B), S_b, T, -1)  # (A, S_b, T, k)
    sq = (p * p).sum(-1)                                                                 # (A, S_b, T)
    if kind == "depth":
        return sq
    return sq[..., :, None] + sq[..., None, :] - 2 * p @ p.transpose(-1, -2)


def _loss(kind: str, data: _Sentences, ids: np.ndarray, B: torch.Tensor, inputs: torch.Tensor | None = None
          ) -> torch.Tensor:
    """(A,) for each input a, the sum over sentences `ids` of the length-normalised L1 loss under B[a]:
    sum_i |pred - gold| / n (depth) or sum_{i,j} |pred - gold| / n^2 (distance, every pair of the n words;
    the sentences taken by length, `_GRAM_SENTENCES` at a time, so that a short one is not padded to the
    batch's longest)."""
    lens = data.lens[ids]
    if kind == "depth":      # one term per word: no padding needed
        rows = torch.from_numpy(_sentence_rows(data.off[ids], lens))
        x = data.x[:, rows] if inputs is None else data.x[inputs[:, None], rows[None, :]]
        p = torch.bmm(x, B.transpose(1, 2))                                                # (A, N_b, k)
        w = torch.from_numpy(np.repeat(1.0 / lens, lens).astype(np.float32))
        return (((p * p).sum(-1) - data.gold[rows]).abs() * w).sum(-1)
    by_length = ids[np.argsort(lens, kind="stable")]
    return sum(_distance_loss(data, by_length[s:s + _GRAM_SENTENCES], B, inputs)
               for s in range(0, len(by_length), _GRAM_SENTENCES))


def _distance_loss(data: _Sentences, ids: np.ndarray, B: torch.Tensor, inputs: torch.Tensor | None) -> torch.Tensor:
    """(A,) sum over sentences `ids` of sum_{i,j} |d_B(i, j) - d_T(i, j)| / n^2, read from their padded block."""
    lens = data.lens[ids]
    pred = _pred_block("distance", data, ids, B, inputs)                                  # (A, S_b, T, T)
    T, n2 = pred.shape[-1], lens * lens
    q = np.arange(n2.sum()) - np.repeat(np.cumsum(n2) - n2, n2)    # pair index i * n + j within its sentence
    n = np.repeat(lens, n2)
    slot = np.repeat(np.arange(len(ids)) * T * T, n2) + (q // n) * T + q % n            # its (b, i, j) in pred
    gold = data.gold[torch.from_numpy(_sentence_rows(data.gold_off[ids], n2))]
    w = torch.from_numpy(np.repeat(1.0 / n2, n2).astype(np.float32))
    pairs = pred.reshape(len(B), -1).index_select(1, torch.from_numpy(slot))            # (A, sum n^2)
    return ((pairs - gold).abs() * w).sum(-1)


class _StructuralProbe(OneLayerEstimator):
    """Shared fit / predict of the distance and depth probes (subclasses set _kind)."""

    _kind = ""
    _PARAMS = ("rank", "lr", "max_epochs", "patience", "batch_size", "val_fraction", "lr_decay", "standardize",
               "seed", "device")

    def __init__(self, rank: int = 128, lr: float = 1e-3, max_epochs: int = 30, patience: int = 3,
                 batch_size: int = 20, val_fraction: float = 0.1, lr_decay: float | None = 0.1,
                 standardize: bool = True, seed: int = 0, device: str = "cpu") -> None:
        self.rank, self.lr, self.max_epochs, self.patience = rank, lr, max_epochs, patience
        self.batch_size, self.val_fraction, self.lr_decay = batch_size, val_fraction, lr_decay
        self.standardize, self.seed, self.device = standardize, seed, device

    def fit(self, X: Any, bounds: Any, heads: Sequence[Any]) -> "_StructuralProbe":
        """X: one layer (N_words, D); bounds (S, 2) sentence rows [start, end); heads: S int arrays (within-sentence
        0-based head positions, -1 for the root)."""
        fit_probes([self], [X], bounds, heads)
        return self

    # ---- inference
    @torch.no_grad()
    def _predict(self, X: Any, bounds: Any) -> list[np.ndarray]:
        if not hasattr(self, "B_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted yet; call fit first")
        layer = self._layer(X)
        bounds, _ = _check_sentences(layer.shape[0], bounds)
        moments = (self.mean_, self.scale_) if hasattr(self, "mean_") else None
        data = _read_sentences([layer], [moments], bounds, None, self.device)
        out: list[np.ndarray] = []
        for s in range(0, len(bounds), _PRED_SENTENCES):
            ids = np.arange(s, min(len(bounds), s + _PRED_SENTENCES))
            pred = _pred_block(self._kind, data, ids, self.B_.detach()[None])[0]
            pred = pred.clamp_min(0).cpu().numpy().astype(np.float64)
            for b, n in enumerate(data.lens[ids]):
                out.append(pred[b, :n] if self._kind == "depth" else pred[b, :n, :n])
        if self._kind == "distance":
            for d in out:
                np.fill_diagonal(d, 0.0)
        return out


# ----------------------------------------------------------------------------- fitting
_JOINT_BYTES = 2**30     # the most input bytes that one joint fit holds in memory (the rest: another group)


def fit_probes(probes: Sequence[_StructuralProbe], Xs: Sequence[Any], bounds: Any, heads: Sequence[Any]
               ) -> list[_StructuralProbe]:
    """Fit probes[i] on Xs[i] (one layer (N_words, D) each), all on the same sentences `bounds` and trees
    `heads`; returns `probes`. Each fit is probes[i].fit(Xs[i], bounds, heads): B drawn uniform in
    [-0.05, 0.05] from the probe's seed, its sentence order, its own Adam, learning-rate decay and early
    stopping. Probes of one class, the same parameters and input width step together (up to `_JOINT_BYTES`
    of inputs at a time): their seed gives them the same validation sentences and the same order of batches,
    so one batched projection (A, N_batch, D) @ (A, D, k) serves the A probes still training, and a probe
    that stops early leaves the batch."""
    if len(probes) != len(Xs):
        raise ValueError(f"Xs: {len(Xs)} inputs for {len(probes)} probes")
    layers = []
    for p, X in zip(probes, Xs):
        for attr in [a for a in vars(p) if a.endswith("_")]:
            delattr(p, attr)
        if not isinstance(p.rank, (int, np.integer)) or p.rank < 1:
            raise ValueError(f"rank: expected a positive int, got {p.rank!r}")
        if not 0 <= p.val_fraction < 1:
            raise ValueError(f"val_fraction: expected a value in [0, 1), got {p.val_fraction}")
        layers.append(p._layer(X))
    if not probes:
        return list(probes)
    n_rows = {layer.shape[0] for layer in layers}
    b, heads = _check_sentences(min(n_rows), bounds, heads, "fit: ")
    if len(n_rows) > 1:   # the sentences' rows must exist in every input
        _check_sentences(max(n_rows), b, None, "fit: ")
    golds = {}
    groups: dict[tuple, list[int]] = {}
    for i, (p, layer) in enumerate(zip(probes, layers)):
        groups.setdefault((type(p), tuple(sorted(p.get_params().items())), layer.shape[1]), []).append(i)
    for (cls, _, width), members in groups.items():
        if cls._kind not in golds:
            golds[cls._kind] = [tree_depths(h) if cls._kind == "depth" else tree_distances(h) for h in heads]
        per = max(1, _JOINT_BYTES // max(1, int(np.diff(b, axis=1).sum()) * width * 4))
        for s in range(0, len(members), per):
            chunk = members[s:s + per]
            _fit_group([probes[i] for i in chunk], [layers[i] for i in chunk], b, golds[cls._kind])
    return list(probes)


def _fit_group(probes: list[_StructuralProbe], layers: list[np.ndarray], bounds: np.ndarray,
               golds: list[np.ndarray]) -> None:
    """Fit probes of one class and parameters, probes[a] on layers[a], stepping together (`fit_probes`)."""
    lead = probes[0]
    for p, layer in zip(probes, layers):
        p.d_in_ = layer.shape[1]
        if p.standardize:
            mean, scale = span_word_stats([layer], [bounds])
            p.mean_, p.scale_ = mean[0], scale[0]          # (D,) float32 each
    moments = [(p.mean_, p.scale_) if p.standardize else None for p in probes]
    data = _read_sentences(layers, moments, bounds, golds, lead.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(lead.seed)
        init = torch.empty(int(lead.rank), lead.d_in_, device=lead.device).uniform_(-0.05, 0.05)
        for p in probes:
            p.B_ = nn.Parameter(init.clone())
        rng = np.random.default_rng(lead.seed)
        perm = rng.permutation(len(bounds))
        n_val = int(round(lead.val_fraction * len(bounds))) if len(bounds) >= 20 else 0
        _train_group(probes, data, perm[n_val:], np.sort(perm[:n_val]), rng)


def _train_group(probes: list[_StructuralProbe], data: _Sentences, train_ids: np.ndarray, val_ids: np.ndarray,
                 rng: np.random.Generator) -> None:
    """Each probe's Adam steps on the shared batches, its validation loss after each epoch, its learning-rate
    decay (the reference's ReduceLROnPlateau, patience 0) and early stopping; a stopped probe leaves the
    batch and gets its best epoch's B back."""
    lead, kind = probes[0], probes[0]._kind
    opts = [torch.optim.Adam([p.B_], lr=lead.lr) for p in probes]
    scheds = [torch.optim.lr_scheduler.ReduceLROnPlateau(o, mode="min", factor=lead.lr_decay, patience=0)
              if lead.lr_decay and len(val_ids) else None for o in opts]
    best, best_B, bad = [float("inf")] * len(probes), [None] * len(probes), [0] * len(probes)
    for p in probes:
        p.history_, p.best_epoch_, p.n_epochs_ = [], -1, 0
    active = list(range(len(probes)))
    val_chunk = max(1, _PRED_SENTENCES // len(probes))      # bounds the (A, S, T, T) block of a validation pass
    for epoch in range(lead.max_epochs):
        inputs = torch.tensor(active) if len(active) < len(probes) else None
        order = train_ids[rng.permutation(len(train_ids))]
        for s in range(0, len(order), lead.batch_size):
            ids = order[s:s + lead.batch_size]
            B = torch.stack([probes[a].B_ for a in active])                       # (A, k, D)
            loss = _loss(kind, data, ids, B, inputs) / len(ids)                  # (A,)
            for a in active:
                opts[a].zero_grad(set_to_none=True)
            loss.sum().backward()         # the probes share no parameter: each gets its own loss's gradient
            for a in active:
                opts[a].step()
        for a in active:
            probes[a].n_epochs_ = epoch + 1
        if len(val_ids) == 0:
            continue
        with torch.no_grad():
            B = torch.stack([probes[a].B_ for a in active])
            val = sum(_loss(kind, data, val_ids[s:s + val_chunk], B, inputs).double()
                      for s in range(0, len(val_ids), val_chunk)) / len(val_ids)
        for a, v in zip(list(active), val.tolist()):
            p = probes[a]
            p.history_.append(v)
            if scheds[a] is not None:
                scheds[a].step(v)
            if v < best[a] - _MIN_DELTA:
                best[a], best_B[a], bad[a], p.best_epoch_ = v, p.B_.detach().clone(), 0, epoch
            else:
                bad[a] += 1
                if bad[a] >= p.patience:
                    active.remove(a)
        if not active:
            break
    for p, b in zip(probes, best_B):
        if b is not None:
            with torch.no_grad():
                p.B_.copy_(b)


class DistanceProbe(_StructuralProbe):
    """Structural distance probe: ||B (h_i - h_j)||^2 fitted to tree path lengths (L1, / n^2 per sentence).

    fit(X, bounds, heads) -> self; predict_distances(X, bounds) -> list of (n, n) arrays.
    Learned: B_ (rank, D), d_in_, n_epochs_, best_epoch_, history_ (validation loss per epoch), and with
    standardize mean_, scale_ ((D,) each)."""

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
    Learned: B_ (rank, D), d_in_, n_epochs_, best_epoch_, history_ (validation loss per epoch), and with
    standardize mean_, scale_ ((D,) each)."""

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


# ----------------------------------------------------------------------------- baselines
def uniform_tree(n: int, rng: np.random.Generator) -> np.ndarray:
    """heads (n,) of a tree drawn uniformly from the n^(n-1) rooted labelled trees on n words: a uniform
    Prüfer sequence (n^(n-2) sequences, one per labelled tree; Prüfer 1918) decoded to edges, rooted at a
    uniformly drawn word. Every edge of a fixed tree is in it with probability 2/n, every word is its root
    with probability 1/n."""
    if n < 1:
        raise ValueError(f"n: expected a number of words >= 1, got {n}")
    adj: list[list[int]] = [[] for _ in range(n)]
    if n >= 2:
        seq = rng.integers(n, size=n - 2)
        degree = np.ones(n, dtype=np.int64) + np.bincount(seq, minlength=n)
        leaves = [int(i) for i in np.flatnonzero(degree == 1)]
        heapq.heapify(leaves)
        for a in seq.tolist():          # join the lowest leaf to the sequence's next word
            b = heapq.heappop(leaves)
            adj[a].append(b), adj[b].append(a)
            degree[a] -= 1
            if degree[a] == 1:
                heapq.heappush(leaves, a)
        a, b = heapq.heappop(leaves), heapq.heappop(leaves)
        adj[a].append(b), adj[b].append(a)
    root = int(rng.integers(n))
    heads = np.full(n, -2, dtype=np.int64)
    heads[root], stack = -1, [root]
    while stack:                         # orient every edge away from the root
        i = stack.pop()
        for j in adj[i]:
            if heads[j] == -2:
                heads[j] = i
                stack.append(j)
    return heads


def _scored_words(heads: Sequence[Any], punct_mask: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
    H = [_check_heads(h, f"heads[{s}]") for s, h in enumerate(heads)]
    return H, _check_masks(punct_mask, [len(h) for h in H])


def random_tree_predictions(kind: str, heads: Sequence[Any], punct_mask: Any, seed: int) -> list[np.ndarray]:
    """One `uniform_tree` per sentence over its non-punctuation words (the words UUAS and root accuracy
    read), drawn with default_rng(seed), as predictions the metrics read: kind "distance" -> (n, n) path
    lengths in it (0 outside the scored words, which no metric of these reads), kind "depth" -> (n,) depths
    below its root (inf on punctuation)."""
    H, masks = _scored_words(heads, punct_mask)
    rng = np.random.default_rng(seed)
    out = []
    for h, m in zip(H, masks):
        keep, n = np.flatnonzero(~m), len(h)
        tree = uniform_tree(len(keep), rng) if keep.size else None
        if kind == "distance":
            p = np.zeros((n, n))
            if tree is not None:
                p[np.ix_(keep, keep)] = tree_distances(tree)
        else:
            p = np.full(n, np.inf)
            if tree is not None:
                p[keep] = tree_depths(tree)
        out.append(p)
    return out


def chain_predictions(kind: str, heads: Sequence[Any]) -> list[np.ndarray]:
    """The adjacent-word chain: distance |i - j| (its minimum spanning tree over the non-punctuation words
    joins each to the next one) or depth i (the first word is the root), per sentence."""
    out = []
    for s, h in enumerate(heads):
        i = np.arange(len(_check_heads(h, f"heads[{s}]")), dtype=np.float64)
        out.append(np.abs(i[:, None] - i[None, :]) if kind == "distance" else i)
    return out


def position_features(bounds: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """One-hot features of each word's index p within its sentence (feature min(p, dim - 1) is 1, the others
    0), one row per word of `bounds`' sentences in order: (X (N, dim) float32, bounds (S, 2) of those rows).
    They carry position and nothing else, and a linear map of them is any embedding of the positions: the
    probe on them fits the best tree metric that position alone can give (sinusoidal features, Vaswani et
    al. 2017, are smooth in p and so ill-conditioned that the same probe under-fits a planted
    position-determined tree on them, UUAS 0.19 where one-hot gives 1.0)."""
    if dim < 1:
        raise ValueError(f"dim: expected a width >= 1, got {dim}")
    b = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
    lens = b[:, 1] - b[:, 0]
    pos = np.concatenate([np.arange(n) for n in lens]) if len(b) else np.zeros(0, dtype=np.int64)
    X = np.zeros((len(pos), dim), dtype=np.float32)
    X[np.arange(len(pos)), np.minimum(pos, dim - 1)] = 1.0
    ends = np.cumsum(lens)
    return X, np.stack([ends - lens, ends], 1)


@dataclass(frozen=True)
class Baseline:
    """A floor of the structural probes: `items(train, test, kind, seed, probe_params)` -> the metrics'
    (per-sentence items, statistic) on `test`, scored as the probe is; `seeded`: whether it changes with
    the seed (a deterministic floor gets one row)."""

    items: Callable[..., dict[str, SentenceItems]]
    seeded: bool
    doc: str


def _random_tree_items(train, test, kind, seed, probe_params) -> dict[str, SentenceItems]:
    pred = random_tree_predictions(kind, test.heads, test.punct_mask, seed)
    if kind == "distance":    # the Spearman metrics read punctuation words, which the tree leaves out
        return {"uuas": uuas_items(pred, test.heads, test.punct_mask)}
    return {"root_acc": root_accuracy_items(pred, test.heads, test.punct_mask)}


def _chain_items(train, test, kind, seed, probe_params) -> dict[str, SentenceItems]:
    pred = chain_predictions(kind, test.heads)
    if kind == "distance":
        return {"uuas": uuas_items(pred, test.heads, test.punct_mask), "dspr": dspr_items(pred, test.heads)}
    return {"root_acc": root_accuracy_items(pred, test.heads, test.punct_mask), "nspr": nspr_items(pred, test.heads)}


def _position_items(train, test, kind, seed, probe_params) -> dict[str, SentenceItems]:
    dim = train.layer(0).shape[1]            # the probe's own shape: as wide as the model's layers
    X_tr, b_tr = position_features(train.bounds, dim)
    X_te, b_te = position_features(test.bounds, dim)
    cls = DistanceProbe if kind == "distance" else DepthProbe
    probe = cls(**{**(probe_params or {}), "seed": seed}).fit(X_tr, b_tr, train.heads)
    return probe.score_items(X_te, b_te, test.heads, test.punct_mask)


# The floors that need no other model (`structural_baseline_scores`); "random_init", the same architecture
# with fresh weights, is probed like the model itself (`structural_layer_scores(..., mode="random_init")`).
STRUCTURAL_BASELINES: dict[str, Baseline] = {
    "random_tree": Baseline(_random_tree_items, True, "a uniformly drawn spanning tree of the non-punctuation "
                            "words (rooted at a uniform word for root accuracy): UUAS 2/m per sentence of m words "
                            "in expectation"),
    "chain": Baseline(_chain_items, False, "each word joined to the next (distance |i - j|), the first word "
                      "the root (depth i)"),
    "position": Baseline(_position_items, True, "the same probe fitted on one-hot features of the word's "
                         "index alone (`position_features`, as wide as the layers)"),
}


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


def _check_task(task: str, n_boot: int) -> tuple[type, str]:
    if task not in STRUCTURAL_TASKS:
        raise ValueError(f"task: expected one of {sorted(STRUCTURAL_TASKS)}, got {task!r}")
    if n_boot < 0:
        raise ValueError(f"n_boot: expected an int >= 0, got {n_boot}")
    return STRUCTURAL_TASKS[task]


def _score_rows(base: dict, seed: int, scored: dict[str, SentenceItems], task: str, n_boot: int, boot_seed: int,
                items_out: dict | None) -> list[dict]:
    """PROBING_COLUMNS rows of one fit's (or floor's) metrics on the test sentences, with the bootstrap
    interval over test sentences (n_boot > 0; seed boot_seed + seed); the task's ITEM_METRICS counts go to
    items_out[(mode, layer, seed)]."""
    rows = []
    for metric, (items, stat) in scored.items():
        if n_boot > 0 and len(items):
            value, lo, hi = bootstrap_ci(items, stat, n_boot=n_boot, seed=boot_seed + seed)
        else:       # no interval asked for, or no sentence the metric is defined on (value nan)
            value, lo, hi = stat(items), float("nan"), float("nan")
        rows.append({**base, "metric": metric, "value": value, "seed": seed, "ci_low": lo, "ci_high": hi})
        if items_out is not None and metric == ITEM_METRICS[task]:
            items_out[(base["mode"], base["layer"], seed)] = item_counts(metric, items)
    return rows


def structural_layer_scores(train: StructuralData | Mapping[int, StructuralData],
                            test: StructuralData | Mapping[int, StructuralData], *,
                            layers: Sequence[int] | None = None, rank: int | None = None,
                            seeds: Sequence[int] = (0,), model: str = "", task: str = "structural_distance",
                            probe_params: dict | None = None, n_boot: int = 0, boot_seed: int = 0,
                            items_out: dict | None = None, mode: str = "single") -> LayerResult:
    """One structural probe per layer and seed (mode `mode`, "single" unless asked), rows in PROBING_COLUMNS:
    metrics "uuas" and "dspr" for task "structural_distance", "root_acc" and "nspr" for "structural_depth";
    with more than one seed a seed = -1 mean row per metric (t interval over seeds).

    `train` / `test` may map each seed to its own data (the "random_init" floor: a freshly initialised
    model per seed, so that the seeds' spread holds the draw of the weights too).

    With n_boot > 0 each per-seed row's ci_low / ci_high is the 95% percentile bootstrap interval over test
    *sentences* (`probes.stats.bootstrap_ci` on the probe's `score_items`), drawn with seed boot_seed + the
    probe's seed (boot_seed = 0: the probe's seed, as the other probes do); with n_boot = 0 they are nan.
    `items_out` (a dict) receives {(mode, layer, seed): (N, 4) counts} of the task's `ITEM_METRICS`
    metric per test sentence (`item_counts`), as the edge probes' `items_out`."""
    cls, probe = _check_task(task, n_boot)
    params = dict(probe_params or {})
    if rank is not None:
        params["rank"] = rank
    pick = lambda data, seed: data[seed] if isinstance(data, Mapping) else data
    if layers is None:
        layers = list(range(pick(train, seeds[0]).n_layers))
    fitted = {}
    for seed in seeds:     # a seed's probes of every layer step together (`fit_probes`)
        tr = pick(train, seed)
        probes = fit_probes([cls(**{**params, "seed": seed}) for _ in layers], [tr.layer(l) for l in layers],
                            tr.bounds, tr.heads)
        fitted.update({(l, seed): p for l, p in zip(layers, probes)})
    rows: list[dict] = []
    for l in layers:
        base = {"model": model, "task": task, "probe": probe, "pooling": "first", "layer": l, "mode": mode}
        for seed in seeds:
            te = pick(test, seed)
            scored = fitted[l, seed].score_items(te.layer(l), te.bounds, te.heads, te.punct_mask)
            rows += _score_rows(base, seed, scored, task, n_boot, boot_seed, items_out)
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS))


def structural_baseline_scores(train: StructuralData, test: StructuralData, *,
                               baselines: Sequence[str] = tuple(STRUCTURAL_BASELINES), seeds: Sequence[int] = (0,),
                               model: str = "", task: str = "structural_distance", probe_params: dict | None = None,
                               n_boot: int = 0, boot_seed: int = 0, items_out: dict | None = None) -> LayerResult:
    """The floors of `STRUCTURAL_BASELINES` on the test sentences, scored as `structural_layer_scores` scores
    the probe: one row per metric and seed with mode = the floor's name and layer = -1 (they read no layer),
    the same bootstrap interval over test sentences, a seed = -1 mean row for seeded floors with more than
    one seed; a deterministic floor ("chain") has one row, seed = seeds[0]. "position" fits the probe
    (`probe_params`) on position features of the training sentences; "random_tree" draws its trees with
    the row's seed. Metrics: the probe's two ("random_tree": UUAS / root accuracy only)."""
    cls, probe = _check_task(task, n_boot)
    bad = [b for b in baselines if b not in STRUCTURAL_BASELINES]
    if bad:
        raise ValueError(f"baselines: unknown {bad}; choose from {sorted(STRUCTURAL_BASELINES)}")
    if not baselines:
        return LayerResult(_frame([], PROBING_COLUMNS))
    rows: list[dict] = []
    for name in baselines:
        floor = STRUCTURAL_BASELINES[name]
        base = {"model": model, "task": task, "probe": probe, "pooling": "first", "layer": -1, "mode": name}
        for seed in (seeds if floor.seeded else seeds[:1]):
            scored = floor.items(train, test, probe, seed, probe_params)
            rows += _score_rows(base, seed, scored, task, n_boot, boot_seed, items_out)
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS))
