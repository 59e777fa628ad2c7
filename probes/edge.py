"""Edge probing classifiers (Tenney et al. 2019a, "What do you learn from context? Probing for
sentence structure in contextualized word representations").

Architecture, for frozen per-word vectors from one layer (X: (N_words, D)) or from K layers
(X: (K, N_words, D), or a list of K (N_words, D) arrays such as the store's per-layer memmaps):

    h_t      = gamma * sum_k s_k x_{k,t}                  ELMo scalar mix (Peters et al. 2018), K > 1 only
    p_t^(i)  = W_i h_t + b_i                              projection to proj_dim (256), one per span i
    r^(i)    = pool_i(p_t^(i) : t in span_i)              `probes.pooling` registry
    logits   = MLP([r^(1); r^(2)])                        Linear(hidden) -> tanh -> LayerNorm -> Dropout
                                                          -> Linear(n_labels)   (jiant's edge-probe MLP)
    P(y)     = softmax(logits)        single-label
    P(y_c)   = sigmoid(logits_c)      multi-label (Tenney's default: one binary classifier per label)

Option `standardize` (not in Tenney et al.'s jiant probe, which reads the vectors as they come):
each layer's features are z-scored, x -> (x - mean) / std with the mean and std of the words the
training spans cover, before the scalar mix and the projection. A probe's optimisation (Adam steps,
init, the tanh of the MLP) is not invariant to the scale of its inputs, so without it a model whose
residual stream grows with depth (pre-LN: T5's goes from norm 16 to 503 across the mini zoo's
layers) reads as losing information where it only grew; with it, the probe sees every layer, and
every model, at unit scale, and the scalar mix's weights stop favouring the layers with the larger
norms (Fayyaz et al. 2021's caveat on E_s). The arc and structural probes standardise likewise.

Metrics: micro-F1 over labels (2TP / (2TP + FP + FN) on label-indicator matrices; equals accuracy in
the single-label case) and accuracy (exact match of the label set in the multi-label case).

Speed: span rows are gathered per batch with vectorised padding masks; float16 inputs are converted
per batch only. For poolers that commute with affine maps (mean, last, endpoint) the raw vectors
are pooled first; with a single layer those pooled vectors are cached once (float16) per fit, so an
epoch is only the projection and the MLP.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from probes.pooling import make_pooler
from probes.scalar_mix import ScalarMix

# Largest float16 cache of pre-pooled span vectors built per fit (bytes).
_PREPOOL_MAX_BYTES = 768 * 2**20
_CHUNK = 4096  # targets per chunk when streaming for caching / prediction
_POOL_CHUNK = 256  # targets per pooling chunk (of similar span widths: a chunk pads to its widest span)


# ----------------------------------------------------------------------------- input checks
def as_layers(X: Any, name: str = "X") -> list[np.ndarray]:
    """Normalise X to a list of K arrays of shape (N_words, D), without copying (memmaps stay memmaps)."""
    if isinstance(X, (list, tuple)):
        layers = list(X)
    elif getattr(X, "ndim", None) == 3:
        layers = [X[k] for k in range(X.shape[0])]
    elif getattr(X, "ndim", None) == 2:
        layers = [X]
    else:
        raise ValueError(f"{name}: expected an array (N_words, D), (K, N_words, D) or a list of (N_words, D) arrays, "
                         f"got {type(X).__name__} with ndim={getattr(X, 'ndim', None)}")
    if not layers:
        raise ValueError(f"{name}: no layers given")
    shape = layers[0].shape
    for k, a in enumerate(layers):
        if getattr(a, "ndim", None) != 2 or a.shape != shape:
            raise ValueError(f"{name}: layer {k} has shape {getattr(a, 'shape', None)}, expected {shape} like layer 0")
    return layers


def check_spans(spans: Any, n_words: int, name: str = "span1", n_targets: int | None = None) -> np.ndarray:
    """Validate (N_targets, 2) int word-row spans, end exclusive, within [0, n_words) and non-empty."""
    s = np.asarray(spans)
    if s.ndim != 2 or s.shape[1] != 2 or not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"{name}: expected an int array of shape (N_targets, 2), got {s.dtype} {s.shape}")
    if n_targets is not None and len(s) != n_targets:
        raise ValueError(f"{name}: has {len(s)} rows but there are {n_targets} targets")
    s = s.astype(np.int64)
    bad = np.flatnonzero((s[:, 0] < 0) | (s[:, 1] > n_words))
    if bad.size:
        i = bad[0]
        raise ValueError(f"{name}: {bad.size} span(s) outside [0, {n_words}) word rows, "
                         f"first at target {i}: {s[i].tolist()}")
    empty = np.flatnonzero(s[:, 1] <= s[:, 0])
    if empty.size:
        i = empty[0]
        raise ValueError(f"{name}: {empty.size} empty span(s) (end <= start), first at target {i}: {s[i].tolist()}")
    return s


def _label_sets(y: Sequence[Any]) -> list[list[Any]]:
    """Each multi-label entry as a list: a scalar label becomes [label]."""
    out = []
    for v in y:
        if isinstance(v, (str, bytes)) or np.isscalar(v):
            out.append([v])
        else:
            out.append(list(v))
    return out


# ----------------------------------------------------------------------------- metrics
def micro_f1(true: np.ndarray, pred: np.ndarray) -> float:
    """Micro-F1 = 2TP / (2TP + FP + FN) over (N, C) 0/1 indicator matrices."""
    true, pred = true.astype(bool), pred.astype(bool)
    tp = np.sum(true & pred)
    denom = 2 * tp + np.sum(~true & pred) + np.sum(true & ~pred)
    return float(2 * tp / denom) if denom else 1.0


# ----------------------------------------------------------------------------- batching
class _SpanFeatures:
    """Gathers padded span rows for batches of targets; optionally caches pre-pooled vectors.

    batch(idx) -> list over spans of (x, mask): x (B, W, K, D) float32 tokens with mask (B, W) bool,
    or pre-pooled pieces x (B, P, K, D) with mask None.
    """

    def __init__(self, layers: list[np.ndarray], spans: list[np.ndarray], pooler_linear: bool,
                 pieces_fns: list, device: torch.device, cache: bool) -> None:
        self.layers, self.spans, self.device = layers, spans, device
        self.pieces_fns = pieces_fns if pooler_linear else None
        self.cache: list[np.ndarray] | None = None
        n, k, d = len(spans[0]), len(layers), layers[0].shape[1]
        n_pieces = [fn(torch.zeros(1, 1, k, d), torch.ones(1, 1, dtype=torch.bool)).shape[1]
                    for fn in pieces_fns] if pooler_linear else []
        if cache and pooler_linear and 2 * n * k * d * sum(n_pieces) <= _PREPOOL_MAX_BYTES:
            self.cache = [np.empty((n, p, k, d), dtype=np.float16) for p in n_pieces]
            for start in range(0, n, _CHUNK):
                idx = np.arange(start, min(n, start + _CHUNK))
                for c, (x, _) in zip(self.cache, self._pooled(idx)):
                    c[idx] = x.numpy().astype(np.float16)

    def __len__(self) -> int:
        return len(self.spans[0])

    def _tokens(self, spans: np.ndarray, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = spans[idx, 0], spans[idx, 1]
        lens = end - start
        w = int(lens.max())
        offs = np.arange(w)
        mask = offs[None, :] < lens[:, None]                              # (B, W)
        rows = np.where(mask, start[:, None] + offs[None, :], start[:, None]).ravel()
        x = np.stack([layer[rows] for layer in self.layers], axis=1)     # (B*W, K, D), input dtype
        x = torch.from_numpy(np.ascontiguousarray(x)).float().reshape(len(idx), w, len(self.layers), -1)
        return x, torch.from_numpy(mask)

    def _pooled(self, idx: np.ndarray) -> list[tuple[torch.Tensor, None]]:
        """Pooled pieces of targets `idx`, in that order. A chunk pads every span to its widest (in file
        order one long constituent would widen a whole chunk), so targets are pooled in order of width,
        in chunks of at most `_POOL_CHUNK` whose widest span is at most twice their narrowest: no span is
        padded to more than twice its width. Each row pools alone: the chunking changes no value."""
        out = []
        for spans, fn in zip(self.spans, self.pieces_fns):
            width = spans[idx, 1] - spans[idx, 0]
            order = np.argsort(width, kind="stable")
            width = width[order]
            parts, start = [], 0
            while start < len(idx):
                end = int(np.searchsorted(width, 2 * width[start], side="right"))
                end = min(max(end, start + 1), start + _POOL_CHUNK)
                x, mask = self._tokens(spans, idx[order[start:end]])
                parts.append(fn(x, mask))
                start = end
            pooled = torch.cat(parts)
            pooled[torch.from_numpy(order)] = pooled.clone()
            out.append((pooled, None))
        return out

    def batch(self, idx: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        if self.cache is not None:
            out = [(torch.from_numpy(c[idx]).float(), None) for c in self.cache]
        elif self.pieces_fns is not None:
            with torch.no_grad():
                out = self._pooled(idx)
        else:
            out = [self._tokens(spans, idx) for spans in self.spans]
        return [(x.to(self.device), None if m is None else m.to(self.device)) for x, m in out]


# ----------------------------------------------------------------------------- the module
class Standardize(nn.Module):
    """(x - mean) / scale over the last two axes (K, D): per layer and feature, fitted once, then fixed."""

    def __init__(self, mean: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean)    # (K, D)
        self.register_buffer("scale", scale)  # (K, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.scale


def span_word_stats(layers: list[np.ndarray], spans: list[np.ndarray],
                    chunk: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation, (K, D) float32 each, of every layer's features over the word rows
    the spans cover (each row once). A feature whose deviation is ~0 gets scale 1 (as scikit-learn's
    StandardScaler), so a constant feature becomes 0 instead of noise divided by ~0."""
    n_words = layers[0].shape[0]
    edges = np.zeros(n_words + 1, dtype=np.int64)
    for s in spans:
        np.add.at(edges, s[:, 0], 1)
        np.add.at(edges, s[:, 1], -1)
    rows = np.flatnonzero(np.cumsum(edges[:-1]) > 0)
    mean = np.zeros((len(layers), layers[0].shape[1]))
    var = np.zeros_like(mean)
    for k, layer in enumerate(layers):
        total, sq = np.zeros(mean.shape[1]), np.zeros(mean.shape[1])
        for start in range(0, len(rows), chunk):
            x = np.asarray(layer[rows[start:start + chunk]], dtype=np.float64)
            total += x.sum(0)
            sq += (x * x).sum(0)
        mean[k] = total / max(len(rows), 1)
        var[k] = np.maximum(sq / max(len(rows), 1) - mean[k] ** 2, 0.0)
    std = np.sqrt(var)
    std[std < 10 * np.finfo(np.float32).eps * np.maximum(1.0, np.abs(mean))] = 1.0
    return mean.astype(np.float32), std.astype(np.float32)


def _mlp(d_in: int, hidden: int, dropout: float, n_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.LayerNorm(hidden),
                         nn.Dropout(dropout), nn.Linear(hidden, n_out))


def _linear(d_in: int, hidden: int, dropout: float, n_out: int) -> nn.Module:
    return nn.Linear(d_in, n_out)


CLASSIFIERS = {"mlp": _mlp, "linear": _linear}


class SpanProbeModule(nn.Module):
    """Scalar mix (K > 1) -> per-span projection -> per-span pooling -> classifier. Shapes as in the module doc."""

    def __init__(self, n_layers: int, d_in: int, n_spans: int, n_out: int, pooling: str,
                 classifier: str, hidden: int, dropout: float, proj_dim: int | None) -> None:
        super().__init__()
        if classifier not in CLASSIFIERS:
            raise ValueError(f"classifier={classifier!r} is unknown; choose one of {sorted(CLASSIFIERS)}")
        self.mix = ScalarMix(n_layers) if n_layers > 1 else None
        d = proj_dim or d_in
        self.proj = nn.ModuleList([nn.Linear(d_in, proj_dim) if proj_dim else nn.Identity()
                                   for _ in range(n_spans)])
        self.pool = nn.ModuleList([make_pooler(pooling, d) for _ in range(n_spans)])
        d_cls = sum(p.out_dim for p in self.pool)
        self.classifier = CLASSIFIERS[classifier](d_cls, hidden, dropout, n_out)
        self.standardize: Standardize | None = None  # set by EdgeProbe.fit(standardize=True)

    def _mix(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-2) if self.mix is None else self.mix(x)  # (..., K, D) -> (..., D)

    def encode(self, i: int, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Span i's pooled vector (B, P * d) from tokens (B, W, K, D) + mask, or pieces (B, P, K, D)."""
        pool = self.pool[i]
        if self.standardize is not None:  # affine: commutes with the linear poolers' pre-pooled pieces
            x = self.standardize(x)
        if mask is None or pool.linear:
            pieces = x if mask is None else pool.pieces(x, mask)      # (B, P, K, D)
            return self.proj[i](self._mix(pieces)).flatten(1)        # (B, P * d)
        return pool(self.proj[i](self._mix(x)), mask)                 # (B, W, d) -> (B, d)

    def forward(self, spans: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor:
        return self.classifier(torch.cat([self.encode(i, x, m) for i, (x, m) in enumerate(spans)], dim=1))


# ----------------------------------------------------------------------------- estimator
class EdgeProbe:
    """Edge probe, scikit-learn shaped (Tenney et al. 2019a).

    fit(X, y, span1, span2=None, X_val=None, y_val=None, span1_val=None, span2_val=None) -> self
      X: (N_words, D) | (K, N_words, D) | list of K (N_words, D) arrays (memmaps welcome);
      y: (N_targets,) labels (str or int; for multilabel, an entry may be a list of labels);
      span1/span2: (N_targets, 2) global word rows, end exclusive.
    Without a validation set, `val_fraction` of the training targets (chosen by `seed`) is held out
    for early stopping on validation loss (best epoch restored); below 20 targets no split is made.
    Learned: classes_, module_, n_layers_, n_epochs_, best_epoch_, history_ (val losses),
    mix_weights_ (K > 1 only: softmax mixing weights s, numpy (K,)).
    `mix_lr` is the Adam step size of the scalar-mix logits and gamma (K > 1 only; larger than `lr`
    so that the weights move away from uniform within a few epochs).
    `classes` fixes the label set in advance (used by MDL probing, where early blocks miss labels).
    `standardize` z-scores each layer's features on the training spans' words (module docstring);
    learned then: mean_, scale_ ((K, D) numpy each).
    """

    def __init__(self, pooling: str = "self_attn", classifier: str = "mlp", hidden: int = 256,
                 dropout: float = 0.3, proj_dim: int | None = 256, multilabel: bool = False,
                 lr: float = 1e-3, batch_size: int = 1024, max_epochs: int = 10, patience: int = 2,
                 val_fraction: float = 0.1, weight_decay: float = 0.0, mix_lr: float = 1e-2,
                 classes: Sequence[Any] | None = None, seed: int = 0, device: str = "cpu",
                 standardize: bool = False) -> None:
        self.mix_lr, self.standardize = mix_lr, standardize
        self.pooling, self.classifier, self.hidden, self.dropout = pooling, classifier, hidden, dropout
        self.proj_dim, self.multilabel, self.lr, self.batch_size = proj_dim, multilabel, lr, batch_size
        self.max_epochs, self.patience, self.val_fraction = max_epochs, patience, val_fraction
        self.weight_decay, self.classes, self.seed, self.device = weight_decay, classes, seed, device

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("pooling", "classifier", "hidden", "dropout", "proj_dim",
                                               "multilabel", "lr", "batch_size", "max_epochs", "patience",
                                               "val_fraction", "weight_decay", "mix_lr", "classes", "seed",
                                               "device", "standardize")}

    def set_params(self, **params: Any) -> "EdgeProbe":
        for k, v in params.items():
            if k not in self.get_params():
                raise ValueError(f"EdgeProbe: unknown parameter {k!r}")
            setattr(self, k, v)
        return self

    # ---- labels
    def _encode(self, y: Any, where: str) -> np.ndarray:
        """Labels -> class indices (N,) or indicator (N, C) float32; unseen labels raise ValueError."""
        index = {c: i for i, c in enumerate(self.classes_.tolist())}
        sets = _label_sets(y) if self.multilabel else [[v] for v in np.asarray(y).tolist()]
        unseen = sorted({str(v) for s in sets for v in s if v not in index})
        if unseen:
            raise ValueError(f"{where}: labels not seen in training: {unseen[:20]}"
                             f"{' ...' if len(unseen) > 20 else ''} (known: {len(index)} classes)")
        if not self.multilabel:
            return np.array([index[s[0]] for s in sets], dtype=np.int64)
        ind = np.zeros((len(sets), len(index)), dtype=np.float32)
        for i, s in enumerate(sets):
            ind[i, [index[v] for v in s]] = 1.0
        return ind

    def _fit_classes(self, y: Any) -> np.ndarray:
        if self.classes is not None:
            return np.array(sorted(self.classes))
        if self.multilabel:
            return np.array(sorted({v for s in _label_sets(y) for v in s}))
        return np.unique(np.asarray(y))

    # ---- features
    def _features(self, X: Any, span1: Any, span2: Any, n: int | None, name: str, cache: bool) -> _SpanFeatures:
        layers = as_layers(X, f"{name}X" if name else "X")
        if hasattr(self, "n_layers_") and (len(layers) != self.n_layers_ or layers[0].shape[1] != self.d_in_):
            raise ValueError(f"{name or 'X'}: got {len(layers)} layers of width {layers[0].shape[1]}, "
                             f"the probe was fitted on {self.n_layers_} layers of width {self.d_in_}")
        n_words = layers[0].shape[0]
        spans = [check_spans(span1, n_words, f"{name}span1", n)]
        if span2 is not None:
            spans.append(check_spans(span2, n_words, f"{name}span2", len(spans[0])))
        module = self.module_
        fns = [p.pieces for p in module.pool]
        linear = all(p.linear for p in module.pool)
        return _SpanFeatures(layers, spans, linear, fns, torch.device(self.device), cache)

    # ---- training
    def fit(self, X: Any, y: Any, span1: Any, span2: Any = None, X_val: Any = None, y_val: Any = None,
            span1_val: Any = None, span2_val: Any = None) -> "EdgeProbe":
        for attr in [a for a in vars(self) if a.endswith("_")]:
            delattr(self, attr)
        layers = as_layers(X)
        n = len(y)
        self.classes_ = self._fit_classes(y)
        target = self._encode(y, "fit: y")
        self.n_layers_, self.d_in_ = len(layers), layers[0].shape[1]
        self.n_spans_ = 1 if span2 is None else 2
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.module_ = SpanProbeModule(self.n_layers_, self.d_in_, self.n_spans_, len(self.classes_),
                                           self.pooling, self.classifier, self.hidden, self.dropout,
                                           self.proj_dim).to(self.device)
            if self.standardize:
                spans = [check_spans(sp, layers[0].shape[0], name, n) for sp, name in
                         ((span1, "span1"), (span2, "span2")) if sp is not None]
                self.mean_, self.scale_ = span_word_stats(layers, spans)
                self.module_.standardize = Standardize(torch.from_numpy(self.mean_),
                                                       torch.from_numpy(self.scale_)).to(self.device)
            with torch.no_grad():
                feats = self._features(layers, span1, span2, n, "", cache=True)
            rng = np.random.default_rng(self.seed)
            if X_val is not None:
                val_feats = self._features(X_val, span1_val, span2_val, len(y_val), "val ", cache=True)
                val_target, train_idx = self._encode(y_val, "fit: y_val"), np.arange(n)
                val_idx = np.arange(len(y_val))
            else:
                val_feats, val_target = feats, target
                perm = rng.permutation(n)
                n_val = int(round(self.val_fraction * n)) if n >= 20 else 0
                val_idx, train_idx = np.sort(perm[:n_val]), perm[n_val:]
            self._train(feats, target, train_idx, val_feats, val_target, val_idx, rng)
        if self.module_.mix is not None:
            self.mix_weights_ = self.module_.mix.numpy_weights()
        return self

    def _loss_fn(self) -> nn.Module:
        return nn.BCEWithLogitsLoss() if self.multilabel else nn.CrossEntropyLoss()

    def _train(self, feats, target, train_idx, val_feats, val_target, val_idx, rng) -> None:
        module, loss_fn = self.module_, self._loss_fn()
        # The mix has K + 1 scalars that must travel far from uniform in a few epochs: own step size.
        mix_ids = {id(q) for q in module.mix.parameters()} if module.mix is not None else set()
        groups = [{"params": [q for q in module.parameters() if id(q) not in mix_ids]}]
        if mix_ids:
            groups.append({"params": list(module.mix.parameters()), "lr": self.mix_lr, "weight_decay": 0.0})
        opt = torch.optim.Adam(groups, lr=self.lr, weight_decay=self.weight_decay)
        tgt = torch.from_numpy(target).to(self.device)
        best, best_state, bad = float("inf"), None, 0
        self.history_, self.best_epoch_, self.n_epochs_ = [], -1, 0
        for epoch in range(self.max_epochs):
            module.train()
            order = train_idx[rng.permutation(len(train_idx))]
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                loss = loss_fn(module(feats.batch(idx)), tgt[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            self.n_epochs_ = epoch + 1
            if len(val_idx) == 0:
                continue
            val_loss = self._mean_loss(val_feats, val_target, val_idx)
            self.history_.append(val_loss)
            if val_loss < best - 1e-6:
                best, best_state, bad, self.best_epoch_ = val_loss, copy.deepcopy(module.state_dict()), 0, epoch
            else:
                bad += 1
                if bad >= self.patience:
                    break
        if best_state is not None:
            module.load_state_dict(best_state)
        module.eval()

    @torch.no_grad()
    def _mean_loss(self, feats: _SpanFeatures, target: np.ndarray, idx: np.ndarray) -> float:
        self.module_.eval()
        loss_fn, total = self._loss_fn(), 0.0
        tgt = torch.from_numpy(target).to(self.device)
        for start in range(0, len(idx), _CHUNK):
            b = idx[start:start + _CHUNK]
            total += float(loss_fn(self.module_(feats.batch(b)), tgt[b])) * len(b)
        self.module_.train()
        return total / len(idx)

    # ---- inference
    def _check_fitted(self) -> None:
        if not hasattr(self, "module_"):
            raise RuntimeError("EdgeProbe is not fitted yet; call fit first")

    @torch.no_grad()
    def predict_proba(self, X: Any, span1: Any, span2: Any = None) -> np.ndarray:
        """(N_targets, C): softmax probabilities (single-label) or per-label sigmoids (multi-label)."""
        self._check_fitted()
        if (span2 is None) != (self.n_spans_ == 1):
            raise ValueError(f"span2: the probe was fitted with {self.n_spans_} span(s)")
        feats = self._features(X, span1, span2, None, "", cache=False)
        self.module_.eval()
        out = []
        for start in range(0, len(feats), _CHUNK):
            logits = self.module_(feats.batch(np.arange(start, min(len(feats), start + _CHUNK))))
            out.append((torch.sigmoid(logits) if self.multilabel else torch.softmax(logits, 1)).cpu().numpy())
        return np.concatenate(out).astype(np.float64)

    def predict(self, X: Any, span1: Any, span2: Any = None) -> np.ndarray:
        """Single-label: (N,) labels from classes_. Multi-label: (N, C) 0/1 indicator, threshold 0.5."""
        proba = self.predict_proba(X, span1, span2)
        if self.multilabel:
            return (proba > 0.5).astype(np.int64)
        return self.classes_[proba.argmax(1)]

    def score(self, X: Any, y: Any, span1: Any, span2: Any = None) -> dict[str, float]:
        """dict(accuracy=, micro_f1=); labels unseen in training raise ValueError naming them."""
        self._check_fitted()
        true = self._encode(y, "score: y")
        proba = self.predict_proba(X, span1, span2)
        if self.multilabel:
            pred = proba > 0.5
            acc = float(np.mean(np.all(pred == true.astype(bool), axis=1)))
            return {"accuracy": acc, "micro_f1": micro_f1(true, pred)}
        pred = proba.argmax(1)
        acc = float(np.mean(pred == true))
        return {"accuracy": acc, "micro_f1": acc}

    def per_item(self, X: Any, y: Any, span1: Any, span2: Any = None) -> np.ndarray:
        """Per-target (correct, tp, fp, fn) counts, (N, 4) float: lets `probes.stats` bootstrap over items."""
        self._check_fitted()
        true = self._encode(y, "per_item: y")
        proba = self.predict_proba(X, span1, span2)
        if self.multilabel:
            t, p = true.astype(bool), proba > 0.5
        else:
            t = np.eye(len(self.classes_), dtype=bool)[true]
            p = np.eye(len(self.classes_), dtype=bool)[proba.argmax(1)]
        return np.stack([np.all(t == p, 1), (t & p).sum(1), (~t & p).sum(1), (t & ~p).sum(1)], 1).astype(float)


class LinearProbe(EdgeProbe):
    """Logistic regression on pooled span vectors: no projection, no hidden layer (torch, same API)."""

    def __init__(self, pooling: str = "mean", multilabel: bool = False, lr: float = 1e-2,
                 batch_size: int = 1024, max_epochs: int = 10, patience: int = 2, val_fraction: float = 0.1,
                 weight_decay: float = 0.0, mix_lr: float = 1e-2, classes: Sequence[Any] | None = None,
                 seed: int = 0, device: str = "cpu", standardize: bool = False) -> None:
        super().__init__(pooling=pooling, classifier="linear", hidden=0, dropout=0.0, proj_dim=None,
                         multilabel=multilabel, lr=lr, batch_size=batch_size, max_epochs=max_epochs,
                         patience=patience, val_fraction=val_fraction, weight_decay=weight_decay,
                         mix_lr=mix_lr, classes=classes, seed=seed, device=device, standardize=standardize)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: v for k, v in super().get_params().items()
                if k not in ("classifier", "hidden", "dropout", "proj_dim")}


PROBES: dict[str, type[EdgeProbe]] = {"edge": EdgeProbe, "linear": LinearProbe}


def make_probe(name: str, **params: Any) -> EdgeProbe:
    """Build the probe registered under `name` ("edge" | "linear") with keyword parameters."""
    if name not in PROBES:
        raise ValueError(f"probe={name!r} is unknown; choose one of {sorted(PROBES)}")
    return PROBES[name](**params)
