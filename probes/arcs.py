"""Dependency-arc (head attachment) probe and its control task (Hewitt & Liang 2019, "Designing and
Interpreting Probes with Control Tasks", dependency edge prediction).

Task: for each word i of a sentence, predict which word j of the same sentence is its syntactic
head; the root attaches to itself. With x_t the layer's vector of word t, standardised per dimension
with the training mean and std (mean_, scale_), the bilinear probe scores every candidate j of i's
sentence

    score(i, j) = x_i^T A x_j + b^T x_j             A: (D, D), or A = U V^T with U, V: (D, rank)
    P(j | i)    = softmax_j score(i, j)             over the words of i's sentence only
    loss        = cross-entropy of the gold head

    accuracy    = UAS = share of scored words whose argmax_j is the gold head

Punctuation is excluded from evaluation by the caller: `score_mask` False for punctuation targets
(training uses every target). Row layout as in the activation store: `dep` is the dependent's global
word row, `head` its head's row (= dep for the root), `bounds` (N, 2) the [start, end) rows of its
sentence, i.e. the candidates.

Control task (authors' code, control-tasks `CorruptedEdgePositionTask`): every word type (the word
string) gets one of three behaviours, uniformly at random and fixed per type: "self" (attach to
itself), "first" (attach to the sentence's first word) or "last" (attach to its last word,
punctuation included). The draw for type t is u = sha256(seed, t) in [0, 1) as in
`probes.controls`, behaviour = min(floor(3u), 2): stable across splits and runs whatever other types
are present. selectivity = accuracy(task) - accuracy(control), same layer, same probe.

Where this differs from the paper:
- Adam with early stopping on validation loss over held-out *training sentences* (`val_fraction`,
  chosen by `seed`, best epoch restored), not a separate dev set;
- inputs are standardised, and so a candidate bias b^T x_j is added: centring would otherwise remove
  the terms linear in x_j that h_i^T A h_j carries through the mean (terms in x_i alone do not change
  the softmax over j, so they need no bias).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import numpy as np
import torch
from torch import nn

from probes.controls import _type_key, _unit_hash, selectivity
from probes.edge import check_spans
from probes.estimator import LayeredData, OneLayerEstimator
from probes.layers import (
    PROBING_COLUMNS,
    SUMMARY_COLUMNS,
    LayerResult,
    _frame,
    _metric_rows,
    _seed_aggregates,
    cross_fit_best,
)

ARC_BEHAVIOURS = ("self", "first", "last")
_CHUNK = 65536       # rows per chunk when computing the standardisation moments
_PRED_SENTENCES = 256  # sentences per batch at inference


# ----------------------------------------------------------------------------- input checks
def _check_targets(n_words: int, dep: Any, bounds: Any, head: Any = None, where: str = "") -> tuple:
    """Validate dep (N,), bounds (N, 2) and optionally head (N,): int rows inside the dependent's sentence."""
    dep = np.asarray(dep)
    if dep.ndim != 1 or not np.issubdtype(dep.dtype, np.integer):
        raise ValueError(f"{where}dep: expected a 1-D int array of word rows, got {dep.dtype} {dep.shape}")
    if len(dep) == 0:
        raise ValueError(f"{where}dep: no targets given (empty input)")
    bounds = check_spans(bounds, n_words, f"{where}bounds", len(dep))
    dep = dep.astype(np.int64)
    arrays = {"dep": dep}
    if head is not None:
        head = np.asarray(head)
        if head.ndim != 1 or not np.issubdtype(head.dtype, np.integer) or len(head) != len(dep):
            raise ValueError(f"{where}head: expected {len(dep)} int word rows like dep, got {head.dtype} {head.shape}")
        arrays["head"] = head = head.astype(np.int64)
    for name, rows in arrays.items():
        bad = np.flatnonzero((rows < bounds[:, 0]) | (rows >= bounds[:, 1]))
        if bad.size:
            i = bad[0]
            raise ValueError(f"{where}{name}: {bad.size} row(s) outside their sentence bounds, first at target {i}: "
                             f"{name}={rows[i]}, bounds={bounds[i].tolist()}")
    return dep, bounds, head


def _check_mask(mask: Any, n: int, name: str = "score_mask") -> np.ndarray:
    m = np.asarray(mask)
    if m.shape != (n,) or m.dtype != bool:
        raise ValueError(f"{name}: expected a bool array of shape ({n},), got {m.dtype} {m.shape}")
    if not m.any():
        raise ValueError(f"{name}: no target is scored (all False)")
    return m


# ----------------------------------------------------------------------------- control task
def arc_control_behaviours(types: Sequence[Hashable], seed: int = 0) -> np.ndarray:
    """Behaviour index into ARC_BEHAVIOURS per type: min(floor(3 * sha256-unit(seed, type)), 2)."""
    cache: dict[str, int] = {}
    out = np.empty(len(types), dtype=np.int64)
    for i, t in enumerate(types):
        key = _type_key(t)
        if key not in cache:
            cache[key] = min(int(3 * _unit_hash(seed, key)), 2)
        out[i] = cache[key]
    return out


def arc_control_heads(types: Sequence[Hashable], dep: Any, bounds: Any, seed: int = 0) -> np.ndarray:
    """Control head row per target (N,): self -> dep, first -> bounds[:, 0], last -> bounds[:, 1] - 1."""
    dep, bounds, _ = _check_targets(int(np.max(bounds, initial=0)) + 1, dep, bounds)
    if len(types) != len(dep):
        raise ValueError(f"types: has {len(types)} entries but there are {len(dep)} targets (dep)")
    choices = np.stack([dep, bounds[:, 0], bounds[:, 1] - 1], 1)
    return choices[np.arange(len(dep)), arc_control_behaviours(types, seed)]


# ----------------------------------------------------------------------------- batching
class _Sentences:
    """Targets grouped by sentence; batch(ids) gathers those sentences' rows into a padded tensor."""

    def __init__(self, layer: np.ndarray, dep: np.ndarray, bounds: np.ndarray) -> None:
        key = bounds[:, 0] * (layer.shape[0] + 1) + bounds[:, 1]   # one sentence = one (start, end)
        _, first, sid = np.unique(key, return_index=True, return_inverse=True)
        self.layer, self.start, self.end = layer, bounds[first, 0], bounds[first, 1]
        order = np.argsort(sid, kind="stable")
        self.groups = np.split(order, np.cumsum(np.bincount(sid))[:-1])  # target ids per sentence
        self.dep_pos = dep - bounds[:, 0]

    def __len__(self) -> int:
        return len(self.start)

    def rows(self) -> np.ndarray:
        return np.concatenate([np.arange(s, e) for s, e in zip(self.start, self.end)])

    def batch(self, ids: np.ndarray, mean: np.ndarray, scale: np.ndarray, device: torch.device):
        """x (B, T, D) float32 standardised, mask (B, T), target ids, their sentence (B) and dep position."""
        start, lens = self.start[ids], self.end[ids] - self.start[ids]
        offs = np.arange(int(lens.max()))
        mask = offs[None, :] < lens[:, None]
        rows = np.where(mask, start[:, None] + offs[None, :], start[:, None]).ravel()
        x = (np.asarray(self.layer[rows], dtype=np.float32) - mean) / scale
        x = torch.from_numpy(x.reshape(len(ids), len(offs), -1)).to(device)
        tgt = np.concatenate([self.groups[s] for s in ids])
        local = np.repeat(np.arange(len(ids)), [len(self.groups[s]) for s in ids])
        return x, torch.from_numpy(mask).to(device), tgt, local, self.dep_pos[tgt]


class _Bilinear(nn.Module):
    """score(i, j) = x_i^T A x_j + b^T x_j, A full (D, D) or U V^T (rank k); padded j masked to -inf."""

    def __init__(self, d: int, rank: int | None) -> None:
        super().__init__()
        self.rank = rank
        if rank is None:
            self.A = nn.Parameter(torch.randn(d, d) / d)
        else:  # U, V ~ N(0, 1/D): scores start O(1) and U = V = 0 would be a saddle point
            self.U = nn.Parameter(torch.randn(d, rank) / d ** 0.5)
            self.V = nn.Parameter(torch.randn(d, rank) / d ** 0.5)
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, local: np.ndarray, dep_pos: np.ndarray) -> torch.Tensor:
        """Scores (n_targets, T) of each target's candidates, from x (B, T, D) and mask (B, T)."""
        left, right = (x @ self.A, x) if self.rank is None else (x @ self.U, x @ self.V)
        scores = left @ right.transpose(1, 2) + (x @ self.b)[:, None, :]            # (B, T, T)
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        return scores[torch.from_numpy(local), torch.from_numpy(dep_pos)]


# ----------------------------------------------------------------------------- estimator
class ArcProbe(OneLayerEstimator):
    """Bilinear head-attachment probe, scikit-learn shaped.

    fit(X, dep, head, bounds) -> self; X: one layer (N_words, D) (memmap welcome) or a 1-element list.
    `batch_size` counts sentences. `val_fraction` of the training sentences (chosen by `seed`) is held
    out for early stopping on validation loss (best epoch restored); below 20 sentences no split.
    Learned: module_, mean_, scale_ (standardisation), d_in_, n_epochs_, best_epoch_, history_.
    Defaults (lr 1e-4, 16 sentences per batch, full rank) were the best of a small grid on
    all-MiniLM-L6-v2 and EWT (250 and 2,000 training sentences; lr 1e-4..1e-3, batch 8..64, rank 32,
    64, 128, full): a full-rank map at lr 1e-3 overfits within the first epoch.
    """

    _PARAMS = ("rank", "lr", "batch_size", "max_epochs", "patience", "val_fraction", "weight_decay", "seed",
               "device")

    def __init__(self, rank: int | None = None, lr: float = 1e-4, batch_size: int = 16, max_epochs: int = 30,
                 patience: int = 3, val_fraction: float = 0.1, weight_decay: float = 0.0, seed: int = 0,
                 device: str = "cpu") -> None:
        self.rank, self.lr, self.batch_size, self.max_epochs = rank, lr, batch_size, max_epochs
        self.patience, self.val_fraction, self.weight_decay = patience, val_fraction, weight_decay
        self.seed, self.device = seed, device

    # ---- training
    def fit(self, X: Any, dep: Any, head: Any, bounds: Any) -> "ArcProbe":
        for attr in [a for a in vars(self) if a.endswith("_")]:
            delattr(self, attr)
        if self.rank is not None and self.rank < 1:
            raise ValueError(f"rank: expected None or a positive int, got {self.rank}")
        layer = self._layer(X)
        dep, bounds, head = _check_targets(layer.shape[0], dep, bounds, head, "fit: ")
        sents = _Sentences(layer, dep, bounds)
        self.d_in_ = layer.shape[1]
        self.mean_, self.scale_ = _moments(layer, sents.rows())
        head_pos = torch.from_numpy(head - bounds[:, 0]).to(self.device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.module_ = _Bilinear(self.d_in_, self.rank).to(self.device)
            rng = np.random.default_rng(self.seed)
            perm = rng.permutation(len(sents))
            n_val = int(round(self.val_fraction * len(sents))) if len(sents) >= 20 else 0
            self._train(sents, head_pos, perm[n_val:], np.sort(perm[:n_val]), rng)
        return self

    def _loss(self, sents: _Sentences, head_pos: torch.Tensor, ids: np.ndarray) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy over the targets of sentences `ids`, and their number."""
        x, mask, tgt, local, dep_pos = sents.batch(ids, self.mean_, self.scale_, torch.device(self.device))
        scores = self.module_(x, mask, local, dep_pos)
        return nn.functional.cross_entropy(scores, head_pos[torch.from_numpy(tgt)], reduction="sum"), len(tgt)

    def _train(self, sents, head_pos, train_ids, val_ids, rng) -> None:
        opt = torch.optim.Adam(self.module_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best, best_state, bad = float("inf"), None, 0
        self.history_, self.best_epoch_, self.n_epochs_ = [], -1, 0
        for epoch in range(self.max_epochs):
            order = train_ids[rng.permutation(len(train_ids))]
            for start in range(0, len(order), self.batch_size):
                total, n = self._loss(sents, head_pos, order[start:start + self.batch_size])
                opt.zero_grad(set_to_none=True)
                (total / n).backward()
                opt.step()
            self.n_epochs_ = epoch + 1
            if len(val_ids) == 0:
                continue
            with torch.no_grad():
                parts = [self._loss(sents, head_pos, val_ids[s:s + _PRED_SENTENCES])
                         for s in range(0, len(val_ids), _PRED_SENTENCES)]
            val_loss = float(sum(t for t, _ in parts)) / sum(n for _, n in parts)
            self.history_.append(val_loss)
            if val_loss < best - 1e-6:
                best, best_state, bad, self.best_epoch_ = val_loss, copy.deepcopy(self.module_.state_dict()), 0, epoch
            else:
                bad += 1
                if bad >= self.patience:
                    break
        if best_state is not None:
            self.module_.load_state_dict(best_state)

    # ---- inference
    @torch.no_grad()
    def predict(self, X: Any, dep: Any, bounds: Any) -> np.ndarray:
        """Predicted head row per target (N,): the argmax candidate of the dependent's sentence."""
        if not hasattr(self, "module_"):
            raise RuntimeError("ArcProbe is not fitted yet; call fit first")
        layer = self._layer(X)
        dep, bounds, _ = _check_targets(layer.shape[0], dep, bounds)
        sents = _Sentences(layer, dep, bounds)
        pred = np.empty(len(dep), dtype=np.int64)
        for s in range(0, len(sents), _PRED_SENTENCES):
            ids = np.arange(s, min(len(sents), s + _PRED_SENTENCES))
            x, mask, tgt, local, dep_pos = sents.batch(ids, self.mean_, self.scale_, torch.device(self.device))
            pred[tgt] = self.module_(x, mask, local, dep_pos).argmax(1).cpu().numpy()
        return bounds[:, 0] + pred

    def per_item(self, X: Any, dep: Any, head: Any, bounds: Any) -> np.ndarray:
        """(N, 4) float (correct, tp, fp, fn) in `_metric_rows` format: one label per word, so micro-F1 = UAS."""
        layer = self._layer(X)
        _, _, head = _check_targets(layer.shape[0], dep, bounds, head)
        ok = (self.predict(layer, dep, bounds) == head).astype(float)
        return np.stack([ok, ok, 1 - ok, 1 - ok], 1)

    def score(self, X: Any, dep: Any, head: Any, bounds: Any) -> float:
        """Accuracy (UAS) over the given targets."""
        return float(self.per_item(X, dep, head, bounds)[:, 0].mean())


def _moments(layer: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and std of layer[rows], streamed in chunks (float64 sums); std 0 -> 1."""
    s = np.zeros(layer.shape[1])
    ss = np.zeros(layer.shape[1])
    for c in range(0, len(rows), _CHUNK):
        x = np.asarray(layer[rows[c:c + _CHUNK]], dtype=np.float64)
        s += x.sum(0)
        ss += (x * x).sum(0)
    mean = s / len(rows)
    std = np.sqrt(np.maximum(ss / len(rows) - mean ** 2, 0.0))
    std[std < 1e-8] = 1.0
    return mean.astype(np.float32), std.astype(np.float32)


# ----------------------------------------------------------------------------- layer-wise analysis
@dataclass(frozen=True)
class ArcData(LayeredData):
    """One split: X per layer ((L+1, N_words, D) array or list of (N_words, D) memmaps), dep / head (N,)
    global word rows, bounds (N, 2) sentence rows [start, end), score_mask (N,) bool or None (= all)."""

    X: Any
    dep: Any
    head: Any
    bounds: Any
    score_mask: Any = None


def arc_layer_scores(train: ArcData, test: ArcData, *, layers: Sequence[int] | None = None, rank: int | None = None,
                     probe_params: dict | None = None, seeds: Sequence[int] = (0,), control: bool = True,
                     train_types: Sequence[Hashable] | None = None, test_types: Sequence[Hashable] | None = None,
                     model: str = "", task: str = "arcs", n_boot: int = 1000, score_mask: Any = None) -> LayerResult:
    """One ArcProbe per layer and seed (mode "single"; "best": the best layer chosen on held-out items,
    `probes.layers.cross_fit_best`), and with `control` the same probe on control heads
    (mode "control", drawn with seed 0 of `arc_control_heads`) plus a seed-mean "selectivity" row per layer.

    Only test targets with score_mask True are evaluated (`score_mask` overrides test.score_mask; e.g.
    False for punctuation); training uses every train target. Summary "selectivity" is taken at the layer
    with the best task accuracy (empty summary without control).
    """
    params = dict(probe_params or {})
    if rank is not None:
        params["rank"] = rank
    layers = list(range(train.n_layers)) if layers is None else list(layers)
    mask = test.score_mask if score_mask is None else score_mask
    keep = slice(None) if mask is None else _check_mask(mask, len(test.dep))
    heads = {"single": (train.head, test.head)}
    if control:
        if train_types is None or test_types is None:
            raise ValueError("arc_layer_scores: control=True needs train_types and test_types (word strings)")
        heads["control"] = (arc_control_heads(train_types, train.dep, train.bounds),
                            arc_control_heads(test_types, test.dep, test.bounds))
    t_dep, t_bounds = np.asarray(test.dep)[keep], np.asarray(test.bounds)[keep]
    rows: list[dict] = []
    acc: dict[tuple[int, str], list[float]] = {}
    task_items: dict[tuple[int, int], np.ndarray] = {}
    for l in layers:
        for mode, (tr_head, te_head) in heads.items():
            base = {"model": model, "task": task, "probe": "bilinear", "pooling": "first", "layer": l, "mode": mode}
            for seed in seeds:
                p = ArcProbe(**{**params, "seed": seed}).fit(train.layer(l), train.dep, tr_head, train.bounds)
                items = p.per_item(test.layer(l), t_dep, np.asarray(te_head)[keep], t_bounds)
                rows += _metric_rows(items, base, seed, n_boot)
                acc.setdefault((l, mode), []).append(float(items[:, 0].mean()))
                if mode == "single":
                    task_items[l, seed] = items
        if control:
            rows.append({**base, "metric": "selectivity", "seed": -1, "ci_low": float("nan"), "ci_high": float("nan"),
                         "value": selectivity(np.mean(acc[l, "single"]), np.mean(acc[l, "control"]))})
    if len(layers) > 1:         # the best layer chosen on held-out items, as per_layer_scores does
        layer, chosen = cross_fit_best(task_items, layers, seeds)
        base = {"model": model, "task": task, "probe": "bilinear", "pooling": "first", "layer": layer, "mode": "best"}
        for seed in seeds:
            rows += _metric_rows(chosen[seed], base, seed, n_boot)
    summary = []
    if control:
        best = max(layers, key=lambda l: np.mean(acc[l, "single"]))
        sel = next(r["value"] for r in rows if r["metric"] == "selectivity" and r["layer"] == best)
        summary = [{"model": model, "task": task, "metric": "selectivity", "value": sel}]
    return LayerResult(_frame(_seed_aggregates(rows), PROBING_COLUMNS), _frame(summary, SUMMARY_COLUMNS))
