"""Attribution of one prediction to its input tokens, and the faithfulness of each attribution.

Methods (each returns a (T,) score per input position for one target):

- attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", eq. 1): the
  head-averaged attention of each layer with the residual added, A~_l = (A_l + I) / 2 (rows renormalised),
  multiplied down the layers, R = A~_L ... A~_1; row `target` of R.
- attention flow (same paper, section 3): the layers as a DAG with nodes (l, i), l = 0..L, an edge
  (l-1, j) -> (l, i) of capacity A~_l[i, j]; the score of input j is the maximum flow from (0, j) to
  (L, target), one max-flow per input (SciPy's `maximum_flow` on capacities scaled to integers,
  `FLOW_SCALE`; tests/probes/test_attribution.py checks it against networkx's float max-flow).
- value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi 2023, "Quantifying Context Mixing in
  Transformers"): at layer l, zero token j's value vectors in every head and read how far each token
  i's layer output (block l's `resid_post`) moves (cosine distance); rows normalised to sum 1 give a mixing matrix per layer,
  rolled out as above without the added residual (the block output already holds it).
- input x gradient (Shrikumar et al. 2017; Denil et al. 2014): sum_d x_td dF/dx_td at the embed site.
- integrated gradients (Sundararajan, Taly & Yan 2017): (x - x') . int_0^1 dF(x' + a (x - x'))/dx da,
  the integral by Gauss-Legendre quadrature with `n_steps` nodes; completeness says the scores sum to
  F(x) - F(x'), and `integrated_gradients` returns the relative error of that sum.

Faithfulness, the same for every method: leave-one-out effects (F(x) - F(x with token j replaced by
its baseline vector)), their Spearman correlation with the method's scores, the deletion curve
(delete the highest-scored tokens first) with its AOPC, mean_k (F(x) - F(x_{-top k})) (Samek et al.
2017; DeYoung et al. 2020), and the insertion curve (every attributed token deleted, then the
highest-scored put back first) with its mean rise, mean_k (F(x_{+top k}) - F(x_{none})) (Petsiuk et
al. 2018, "RISE"), all beside the same numbers for a random attribution.

F is any scalar of a forward pass, seen as a function of the vectors at the model's `embed` hook site
(`EmbedTarget`); the baseline x' is the embed-site vector of the padding token at each position.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow
from scipy.stats import spearmanr

FLOW_SCALE = 10**6  # capacities are probabilities; scaled to integers for SciPy's max-flow (error <= L / 1e6)


def _with_residual(attn: np.ndarray, residual: float) -> np.ndarray:
    """attn (L, T, T) row-stochastic -> residual * I + (1 - residual) * attn, rows renormalised."""
    attn = np.asarray(attn, dtype=np.float64)
    if attn.ndim != 3 or attn.shape[1] != attn.shape[2]:
        raise ValueError(f"attention must be (L, T, T), got {attn.shape}")
    a = residual * np.eye(attn.shape[1]) + (1.0 - residual) * attn
    return a / a.sum(-1, keepdims=True)


def rollout(attn: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """attn (L, T, T), layer l's head-averaged attention (rows: queries) -> R (T, T), R[i, j] the share
    of output position i that rolls out to input j (Abnar & Zuidema 2020, eq. 1). residual=0 rolls out
    the matrices as given (value zeroing's mixing matrices)."""
    a = _with_residual(attn, residual)
    out = np.eye(a.shape[1])
    for layer in a:
        out = layer @ out
    return out


def flow_capacities(attn: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """The attention graph as a dense ((L+1) T, (L+1) T) capacity matrix: node l*T + i is position i
    at layer l; cap[(l-1) T + j, l T + i] = A~_l[i, j]."""
    a = _with_residual(attn, residual)
    L, T = a.shape[0], a.shape[1]
    cap = np.zeros(((L + 1) * T, (L + 1) * T))
    for l in range(1, L + 1):
        cap[(l - 1) * T: l * T, l * T: (l + 1) * T] = a[l - 1].T
    return cap


def attention_flow(attn: np.ndarray, target: int, residual: float = 0.5) -> np.ndarray:
    """(T,) maximum flow from each input node (0, j) to the output node (L, target).

    Each max-flow runs on the target's ancestor graph: the top layer keeps the node (L, target) alone,
    and the nodes with no path to it (positions after the target in a causal model, every layer) are
    dropped; the flow values are those of the whole graph, since a dropped node carries no flow to
    the sink."""
    a = _with_residual(attn, residual)
    L, T = a.shape[0], a.shape[1]
    reach = np.zeros((L + 1, T), dtype=bool)  # reach[l, i]: (l, i) has a path to (L, target)
    reach[L, target] = True
    for l in range(L, 0, -1):
        reach[l - 1] = (a[l - 1][reach[l]] > 0).any(0)
    nodes = np.flatnonzero(reach.ravel())  # kept nodes, in (l, i) order
    index = np.full((L + 1) * T, -1)
    index[nodes] = np.arange(len(nodes))
    src, dst, cap = [], [], []
    for l in range(1, L + 1):
        i_kept, j_kept = np.flatnonzero(reach[l]), np.flatnonzero(reach[l - 1])
        block = a[l - 1][np.ix_(i_kept, j_kept)]  # (i, j): capacity (l-1, j) -> (l, i)
        ii, jj = np.nonzero(block)
        src.append(index[(l - 1) * T + j_kept[jj]])
        dst.append(index[l * T + i_kept[ii]])
        cap.append(block[ii, jj])
    src, dst, cap = np.concatenate(src), np.concatenate(dst), np.rint(np.concatenate(cap) * FLOW_SCALE).astype(np.int32)
    graph = csr_matrix((cap, (src, dst)), shape=(len(nodes), len(nodes)))
    sink = index[L * T + target]
    return np.array([maximum_flow(graph, int(index[j]), int(sink)).flow_value / FLOW_SCALE if reach[0, j] else 0.0
                     for j in range(T)])


class EmbedTarget:
    """A scalar F of a forward pass as a function of the `embed` hook site's vectors.

    hooked: the model that has the `embed` site; score(ids (S, T)) -> (S,) runs the forward (of
    `hooked` or a model around it, e.g. a classifier) and returns F; ids (T,) the sentence; pad_id:
    the token whose embed-site vectors are the baseline. `x` (T, D), `baseline` (T, D)."""

    def __init__(self, hooked, score: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, pad_id: int) -> None:
        self.hooked, self.score, self.ids = hooked, score, ids
        self.x = self._capture(ids)
        self.baseline = self._capture(torch.full_like(ids, pad_id))

    @torch.no_grad()
    def _capture(self, ids: torch.Tensor) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        with self.hooked.hooks([("embed", lambda h, name: seen.append(h.detach()))]):
            self.score(ids[None])
        return seen[0][0]

    def __call__(self, embeds: torch.Tensor) -> torch.Tensor:
        """embeds (S, T, D) -> F (S,)."""
        with self.hooked.hooks([("embed", lambda h, name: embeds)]):
            return self.score(self.ids[None].expand(len(embeds), -1))


def _grad(f: Callable[[torch.Tensor], torch.Tensor], points: torch.Tensor) -> torch.Tensor:
    points = points.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(f(points).sum(), points)
    return g


def input_x_gradient(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> np.ndarray:
    """x (T, D) -> (T,) sum_d x * dF/dx."""
    return (x * _grad(f, x[None])[0]).sum(-1).double().numpy()


def integrated_gradients(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, baseline: torch.Tensor,
                         n_steps: int = 16, batch: int = 32) -> tuple[np.ndarray, float]:
    """x, baseline (T, D) -> ((T,) attributions, relative completeness error
    |sum attr - (F(x) - F(x'))| / |F(x) - F(x')|), the path integral by n_steps-node Gauss-Legendre."""
    nodes, weights = np.polynomial.legendre.leggauss(n_steps)
    alphas = torch.tensor((nodes + 1) / 2, dtype=x.dtype)  # [-1, 1] -> [0, 1]
    w = torch.tensor(weights / 2, dtype=x.dtype)
    diff = x - baseline
    total = torch.zeros_like(x)
    for s in range(0, n_steps, batch):
        a = alphas[s: s + batch, None, None]
        g = _grad(f, baseline[None] + a * diff[None])  # (S, T, D)
        total += (w[s: s + batch, None, None] * g).sum(0)
    attr = (diff * total).sum(-1).double().numpy()
    with torch.no_grad():
        fx, fb = (float(v) for v in f(torch.stack([x, baseline])))
    gap = fx - fb
    return attr, abs(attr.sum() - gap) / max(abs(gap), 1e-12)


@torch.no_grad()
def _replaced(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, baseline: torch.Tensor,
              masks: torch.Tensor, batch: int = 64) -> np.ndarray:
    """F with the rows where masks (S, T) is True replaced by the baseline's, (S,)."""
    out = []
    for s in range(0, len(masks), batch):
        m = masks[s: s + batch, :, None]
        out.append(f(torch.where(m, baseline[None], x[None])).double())
    return torch.cat(out).numpy()


def loo_masks(T: int, positions: np.ndarray) -> torch.Tensor:
    """(len(positions) + 1, T) bool: row 0 intact, row 1 + i deletes positions[i]."""
    masks = torch.zeros(len(positions) + 1, T, dtype=torch.bool)
    masks[torch.arange(1, len(positions) + 1), torch.as_tensor(np.asarray(positions), dtype=torch.long)] = True
    return masks


def deletion_masks(T: int, positions: np.ndarray, scores: np.ndarray, k: int) -> torch.Tensor:
    """(min(k, P) + 1, T) bool: row i deletes the i highest-scored of `positions` (ties: first listed)."""
    order = np.asarray(positions)[np.argsort(-np.asarray(scores), kind="stable")][:k]
    masks = torch.zeros(len(order) + 1, T, dtype=torch.bool)
    for i in range(1, len(order) + 1):
        masks[i, torch.as_tensor(order[:i])] = True
    return masks


def insertion_masks(T: int, positions: np.ndarray, scores: np.ndarray, k: int) -> torch.Tensor:
    """(min(k, P) + 1, T) bool: every one of `positions` deleted, except (row i) the i highest-scored."""
    positions = np.asarray(positions)
    order = positions[np.argsort(-np.asarray(scores), kind="stable")][:k]
    masks = torch.zeros(len(order) + 1, T, dtype=torch.bool)
    masks[:, torch.as_tensor(positions, dtype=torch.long)] = True
    for i in range(1, len(order) + 1):
        masks[i, torch.as_tensor(order[:i])] = False
    return masks


def leave_one_out(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, baseline: torch.Tensor,
                  positions: np.ndarray) -> np.ndarray:
    """(len(positions),) F(x) - F(x with token j replaced by its baseline vector), j in positions."""
    vals = _replaced(f, x, baseline, loo_masks(x.shape[0], positions))
    return vals[0] - vals[1:]


def deletion_curve(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, baseline: torch.Tensor,
                   positions: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """(k+1,) F after deleting (replacing by the baseline) the 0..k highest-scored of `positions`."""
    return _replaced(f, x, baseline, deletion_masks(x.shape[0], positions, scores, k))


def insertion_curve(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, baseline: torch.Tensor,
                    positions: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """(k+1,) F with every one of `positions` deleted, then the 1..k highest-scored put back."""
    return _replaced(f, x, baseline, insertion_masks(x.shape[0], positions, scores, k))


def faithfulness(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, baseline: torch.Tensor,
                 positions: np.ndarray, scores: Mapping[str, np.ndarray], k: int,
                 batch: int = 256) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The leave-one-out effects (P,), each scoring's deletion curve (k+1,) and insertion curve (k+1,)
    from one batched pass: every distinct mask of `leave_one_out`, `deletion_curve` and
    `insertion_curve` read once by `f`, in batches of `batch` rows. Equal to calling those functions
    one by one, up to the round-off of a different batch composition (tests/probes/test_attribution.py)."""
    T = x.shape[0]
    dele = [deletion_masks(T, positions, sc, k)[1:] for sc in scores.values()]
    ins = [insertion_masks(T, positions, sc, k) for sc in scores.values()]
    parts = [loo_masks(T, positions)] + dele + ins
    # a mask shared by several curves (every deletion curve's first step is a leave-one-out row, every
    # insertion curve starts from the same empty input) is read once
    unique, inverse = torch.unique(torch.cat(parts), dim=0, return_inverse=True)
    vals = _replaced(f, x, baseline, unique, batch=batch)[inverse.numpy()]
    intact, loo = vals[0], vals[0] - vals[1: len(positions) + 1]
    deletion, insertion, at = {}, {}, len(positions) + 1
    for name, part in zip(scores, dele):
        deletion[name] = np.concatenate([[intact], vals[at: at + len(part)]])
        at += len(part)
    for name, part in zip(scores, ins):
        insertion[name] = vals[at: at + len(part)]
        at += len(part)
    return loo, deletion, insertion


def aopc(curve: np.ndarray) -> float:
    """Mean drop from the intact score over the deletion steps 1..k of a deletion curve (k+1,)."""
    curve = np.asarray(curve)
    return float((curve[0] - curve[1:]).mean()) if len(curve) > 1 else float("nan")


def insertion_aopc(curve: np.ndarray) -> float:
    """Mean rise over the empty input across the insertion steps 1..k of an insertion curve (k+1,)."""
    curve = np.asarray(curve)
    return float((curve[1:] - curve[0]).mean()) if len(curve) > 1 else float("nan")


def rank_correlation(scores: np.ndarray, reference: np.ndarray) -> float:
    """Spearman's rho between a method's scores and the leave-one-out effects (NaN if either is constant)."""
    scores, reference = np.asarray(scores), np.asarray(reference)
    if len(scores) < 3 or np.ptp(scores) == 0 or np.ptp(reference) == 0:
        return float("nan")
    return float(spearmanr(scores, reference).statistic)


class _Stop(Exception):
    """Raised by a hook to end a forward once the layer it needs is computed."""


@torch.no_grad()
def value_zeroing(hooked, run: Callable[[torch.Tensor], object], ids: torch.Tensor) -> np.ndarray:
    """(L, T, T) value-zeroing mixing matrices of one sentence ids (T,) (Mohebbi et al. 2023):
    M_l[i, j] = 1 - cos(h_l(i), h_l(i | v_j = 0 at layer l)), rows normalised to sum 1, h_l the output
    of block l (its `blocks.{l}.resid_post` site). run(ids (S, T)) runs `hooked`'s forward.

    Per layer l one forward of T + 1 rows (row j zeroes token j's values at layer l, the last row is
    the intact sentence, in the same batch so that batch-size round-off cancels), stopped once block
    l is computed: the layers above it would be thrown away (for L = 4 this does 10 of the 16 block
    passes that one forward of all L T + 1 rows through every layer does)."""
    T = ids.shape[0]
    batch = ids[None].expand(T + 1, -1)
    rows = torch.arange(T)

    def zero_own(v: torch.Tensor, name: str) -> torch.Tensor:  # v (T+1, T, H, Dh)
        v = v.clone()
        v[rows, rows] = 0.0
        return v

    L = hooked.config.n_layers
    out = np.zeros((L, T, T))
    for l in range(L):
        seen: list[torch.Tensor] = []

        def stop(h: torch.Tensor, name: str) -> torch.Tensor:
            seen.append(h)
            raise _Stop

        with hooked.hooks([(f"blocks.{l}.attn.v", zero_own), (f"blocks.{l}.resid_post", stop)]):
            try:
                run(batch)
            except _Stop:
                pass
        h = seen[0].double()  # (T+1, T, D); float32 cosines of equal vectors miss 1 by ~1e-7, as large as a faint real effect
        dist = 1.0 - F.cosine_similarity(h[:T], h[T:].expand(T, -1, -1), dim=-1)  # (j, i)
        m = dist.T.clamp_min(0).numpy()  # (i, j)
        out[l] = m / np.where(m.sum(-1, keepdims=True) > 0, m.sum(-1, keepdims=True), 1.0)
    return out
