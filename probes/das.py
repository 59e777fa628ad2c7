"""Distributed alignment search (DAS): an interchange intervention on a learned subspace of one site
(Geiger, Wu, Icard, Potts & Goodman 2023, "Finding alignments between interpretable causal variables
and distributed neural representations", Sec. 3; Wu, Geiger, Icard, Potts & Goodman 2023,
"Interpretability at scale: identifying causal mechanisms in Alpaca", whose boundless DAS learns k too).

The hypothesis "site z holds variable V (the subject's number)" is tested by interchange interventions
(Geiger et al. 2021, `probes.mediation.interchange_hits`): run the base input with z set to its value
under a source input, and ask whether the model then behaves as V's source value says. Patching the
whole of z asks whether z holds V among everything else it holds; DAS asks whether V lives in a
k-dimensional subspace of z, one that need not be aligned with the neurons. With h_b and h_s the base
and source runs' activations at the site (one D-vector per row: a residual stream at one position), R
an orthogonal D x D matrix (rotated coordinates r = R^T h) and Q = R[:, :k] its first k columns,

    h' = R (M R^T h_s + (I - M) R^T h_b) = h_b + Q Q^T (h_s - h_b),      M = diag(1 x k, 0 x (D - k)),

the base's first k rotated coordinates replaced by the source's and rotated back. At k = D it is the
whole-site interchange (Q Q^T = I). R is `torch.nn.utils.parametrizations.orthogonal` of a D x D
matrix (the Haar draw of `seed` times the matrix exponential of a trained skew-symmetric matrix),
trained by Adam (its step decaying linearly to 0) on the binary cross-entropy of the counterfactual
label with the model's weights frozen: y = 1 when the hypothesis says the intervened run's decision d'
(one number per pair, below) should be positive, 0 when negative. The interchange intervention
accuracy (IIA) of held-out pairs is the share with (d' > 0) = y.

Pairs (`InterchangePairs`) are two aligned batches of R rows (mappings of (R, ...) tensors, what
`probes.patching` takes) with each row's pair (`item`, 0..N-1) and sign (`weight`): pair n's decision
is d_n = sum over its rows of weight_r * score_r, so a decision may add up several scored inputs (each
subword of two verb forms, + for one form and - for the other). `score(model, batch) -> (R,)` is one
number per row, differentiable in the site's activation.

Floors, all at the same site and k unless said: `epochs=0` is the untrained random rotation (a random
k-dimensional subspace); the same search on a randomly initialised model (the caller builds it:
`plmodels.checkpoint.random_init_model`); `whole_site_hits`, the interchange of the whole site (the
k = D ceiling of DAS) under the same labels. Makelov et al. (2023, "Is this the subspace you are
looking for?") show a trained subspace can reach high IIA through a dormant direction, which is why the
random-init model sits beside it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import orthogonal

from probes.patching import Batch, Score, Site, check_sites, patch_sites


def _take_rows(batch: Mapping[str, Tensor | None] | None, rows: Tensor) -> dict[str, Tensor | None] | None:
    return None if batch is None else {k: (None if v is None else v[rows]) for k, v in batch.items()}


@dataclass(frozen=True)
class InterchangePairs:
    """N interchange pairs as two aligned batches of R >= N rows (module docstring)."""

    base: Batch  # {name: (R, ...)} the inputs the intervention is made in
    source: Batch  # {name: (R, ...)} aligned with base row by row: the site's value comes from here
    item: Tensor  # (R,) long: the pair each row belongs to, 0..N-1, every pair with at least one row
    weight: Tensor | None = None  # (R,) d_n = sum of weight_r * score_r over pair n's rows; None: all 1
    positions: Mapping[str, Tensor] | None = None  # {name: (R,)} per-row positions a Site may name

    def __post_init__(self) -> None:
        R = len(self.item)
        sizes = {f"{side}[{k}]": len(v) for side, b in (("base", self.base), ("source", self.source))
                 for k, v in b.items() if v is not None}
        sizes |= {f"positions[{k}]": len(v) for k, v in (self.positions or {}).items()}
        if self.weight is not None:
            sizes["weight"] = len(self.weight)
        bad = {k: n for k, n in sizes.items() if n != R}
        if bad:
            raise ValueError(f"InterchangePairs: every tensor needs one row per entry of item ({R} rows); {bad}")
        if R and sorted(set(self.item.tolist())) != list(range(int(self.item.max()) + 1)):
            raise ValueError("InterchangePairs.item must number the pairs 0..N-1, each with at least one row")

    @classmethod
    def one_row_each(cls, base: Batch, source: Batch, positions: Mapping[str, Tensor] | None = None
                     ) -> InterchangePairs:
        """Pairs of one row each (d_n = score_n)."""
        n = len(next(v for v in base.values() if v is not None))
        return cls(base, source, torch.arange(n), None, positions)

    @property
    def n_pairs(self) -> int:
        return int(self.item.max()) + 1 if len(self.item) else 0

    @property
    def weights(self) -> Tensor:
        return torch.ones(len(self.item)) if self.weight is None else self.weight

    def rows(self, idx: Tensor) -> Tensor:
        """(r,) the rows of pairs idx, in the order of idx (rows of one pair in their order)."""
        return torch.cat([torch.nonzero(self.item == i).flatten() for i in idx.tolist()]) if len(idx) else \
            torch.zeros(0, dtype=torch.long)

    def take(self, idx: Tensor | np.ndarray | list[int]) -> InterchangePairs:
        """The pairs idx (their rows), renumbered 0..len(idx)-1 in the order of idx."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        rows = self.rows(idx)
        renumber = torch.full((self.n_pairs,), -1, dtype=torch.long)
        renumber[idx] = torch.arange(len(idx))
        return InterchangePairs(_take_rows(self.base, rows), _take_rows(self.source, rows), renumber[self.item[rows]],
                                None if self.weight is None else self.weight[rows], _take_rows(self.positions, rows))

    def decisions(self, row_scores: Tensor) -> Tensor:
        """(R,) row scores -> (N,) d_n = sum over pair n's rows of weight * score."""
        out = torch.zeros(self.n_pairs, dtype=row_scores.dtype, device=row_scores.device)
        return out.index_add(0, self.item.to(row_scores.device), row_scores * self.weights.to(row_scores))


def _labels(X: InterchangePairs, y) -> Tensor:
    y = torch.as_tensor(np.asarray(y, dtype=np.float64))
    if y.shape != (X.n_pairs,) or not bool(((y == 0) | (y == 1)).all()):
        raise ValueError(f"DAS: y must be ({X.n_pairs},) labels of 0/1 (1: the intervened decision should be "
                         f"positive), got shape {tuple(y.shape)}")
    return y


@contextmanager
def _frozen(model: nn.Module) -> Iterator[None]:
    """The model's parameters need no gradient inside (only the rotation trains); restored after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def haar_rotation(d: int, seed: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """(d, d) an orthogonal matrix drawn from the Haar measure (QR of a Gaussian, signs fixed by R's diagonal)."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def interchange(h_base: Tensor, h_source: Tensor, Q: Tensor) -> Tensor:
    """(n, D) h_b + Q Q^T (h_s - h_b): the base's coordinates along Q's k orthonormal columns (D, k)
    replaced by the source's (module docstring)."""
    return h_base + ((h_source - h_base) @ Q) @ Q.T


class DistributedAlignmentSearch:
    """DAS at one site as a scikit-learn shaped estimator: `fit(X, y)` on training pairs learns the
    rotation, `score(X, y)` is the IIA on other pairs (module docstring).

    model: a hooked model (`model.hooks`), used as is (its weights are not changed); score_fn(model,
    batch) -> (R,); site: a `probes.patching.Site` that covers one D-vector per row (a position, and a head for a
    per-head site); k: the subspace's dimension, 1..D; epochs: passes over the training pairs (0: the
    random rotation of `seed`, untrained: the floor); lr: Adam's step; batch_size: pairs per step; seed:
    the initial rotation and the order of the pairs.
    """

    def __init__(self, model: nn.Module, score_fn: Score, site: Site, k: int = 1, epochs: int = 20,
                 lr: float = 1e-2, batch_size: int = 64, seed: int = 0) -> None:
        self.model = model
        self.score_fn = score_fn
        self.site = site
        self.k = k
        self.epochs = epochs
        self.lr = lr
        self.batch_size = batch_size
        self.seed = seed

    # ----------------------------------------------------------------------------------- the site
    def _check(self) -> None:
        check_sites(self.model, [self.site])
        for name, low in (("k", 1), ("epochs", 0), ("batch_size", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"DAS: {name} must be >= {low}, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"DAS: lr must be > 0, got {self.lr}")

    def _slice(self, t: Tensor, positions: Mapping[str, Tensor] | None) -> tuple[tuple, Tensor]:
        idx = self.site.index(t.dim(), positions)
        h = t[idx]
        if h.dim() != 2:
            raise ValueError(f"DAS: site {self.site.label} covers a slice of shape {tuple(h.shape)} per batch, not one "
                             "vector per row: give it a position (and a head, for a per-head site)")
        return idx, h

    @torch.no_grad()
    def source_vectors(self, X: InterchangePairs) -> Tensor:
        """(R, D) the site's activation in each source row."""
        out: list[Tensor] = []

        def save(t: Tensor, name: str) -> None:
            out.append(self._slice(t, X.positions)[1].detach())

        with self.model.hooks([(self.site.hook, save)]):
            self.score_fn(self.model, X.source)
        if len(out) != 1:
            raise ValueError(f"DAS: site {self.site.label} ran {len(out)} times in one forward, not once")
        return out[0]

    def _intervened(self, X: InterchangePairs, h_source: Tensor, Q: Tensor) -> Tensor:
        """(N,) the decisions of the base runs with the site's Q-coordinates from the source rows."""
        def swap(t: Tensor, name: str) -> Tensor:
            idx, h = self._slice(t, X.positions)
            out = t.clone()
            out[idx] = interchange(h, h_source.to(h.dtype), Q.to(h.dtype))
            return out

        with self.model.hooks([(self.site.hook, swap)]):
            return X.decisions(self.score_fn(self.model, X.base))

    # ----------------------------------------------------------------------------------- fit / score
    def fit(self, X: InterchangePairs, y) -> DistributedAlignmentSearch:
        """Learn the rotation on the training pairs X with counterfactual labels y (N,) of 0/1.

        Sets rotation_ (D, D), subspace_ (D, k) = rotation_[:, :k], loss_curve_ (the mean training loss of
        each epoch) and n_features_in_ (D)."""
        self._check()
        y = _labels(X, y)
        h_src = self.source_vectors(X)
        d = h_src.shape[1]
        if self.k > d:
            raise ValueError(f"DAS: k must be <= the site's dimension {d}, got {self.k}")
        rotator = nn.Linear(d, d, bias=False, dtype=h_src.dtype)
        with torch.no_grad():
            rotator.weight.copy_(haar_rotation(d, self.seed, h_src.dtype))
        orthogonal(rotator)  # weight = the Haar draw @ matrix_exp(skew(A)), A trained from 0
        opt = torch.optim.Adam(rotator.parameters(), lr=self.lr)
        g = torch.Generator().manual_seed(self.seed)
        n_steps = self.epochs * -(-X.n_pairs // self.batch_size)
        # the step decays linearly to 0, so the last epochs settle instead of stepping around the optimum
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / max(n_steps, 1))
        self.loss_curve_ = []
        with _frozen(self.model):
            for _ in range(self.epochs):
                total = 0.0
                for idx in torch.randperm(X.n_pairs, generator=g).split(self.batch_size):
                    rows = X.rows(idx)
                    d_int = self._intervened(X.take(idx), h_src[rows], rotator.weight[:, : self.k])
                    loss = F.binary_cross_entropy_with_logits(d_int, y[idx].to(d_int.dtype))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    sched.step()
                    total += loss.item() * len(idx)
                self.loss_curve_.append(total / X.n_pairs)
        self.rotation_ = rotator.weight.detach().clone()
        self.subspace_ = self.rotation_[:, : self.k]
        self.n_features_in_ = d
        return self

    @torch.no_grad()
    def decision_function(self, X: InterchangePairs) -> Tensor:
        """(N,) d' of each pair: the base run with the site's subspace coordinates from the source."""
        if not hasattr(self, "rotation_"):
            raise ValueError("DAS: call fit before decision_function / predict / score")
        h_src = self.source_vectors(X)
        out = []
        for idx in torch.arange(X.n_pairs).split(self.batch_size):
            rows = X.rows(idx)
            out.append(self._intervened(X.take(idx), h_src[rows], self.subspace_))
        return torch.cat(out)

    def predict(self, X: InterchangePairs) -> np.ndarray:
        """(N,) 1 where the intervened decision is positive, else 0."""
        return (self.decision_function(X) > 0).double().numpy()

    def hits(self, X: InterchangePairs, y) -> np.ndarray:
        """(N,) 1.0 where the intervened run behaves as the label says, else 0.0."""
        return (self.predict(X) == _labels(X, y).numpy()).astype(np.float64)

    def score(self, X: InterchangePairs, y) -> float:
        """The interchange intervention accuracy on the pairs X."""
        return float(self.hits(X, y).mean())


def whole_site_hits(model: nn.Module, score: Score, site: Site, X: InterchangePairs, y,
                    batch_size: int = 256) -> np.ndarray:
    """(N,) the hits of the interchange of the whole site (`probes.patching.patch_sites`), the k = D
    ceiling of DAS at that site, under the same labels."""
    y = _labels(X, y)
    _, _, patched = patch_sites(model, score, X.base, X.source, [site], batch_size, X.positions)
    d = X.decisions(patched[0])
    return ((d > 0).double() == y).double().numpy()
