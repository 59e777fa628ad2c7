"""Cross-attention heads of encoder-decoders: where does each target position look in the source?

Pure array code, shaped like `probes.heads.HeadStats`: `CrossAttentionStats` streams one sentence at
a time (``update(CrossSentence)``, then ``finalize(model)``) and returns a tidy table in the
`heads` layout (model, layer, head, score, value), named ``cross_heads``.

Input per sentence (`CrossSentence`): ``attn`` (L, H, T_tgt, T_src), the decoder's cross-attention
probabilities, row t = attention *from* target position t (the decoder position that predicts
target token t under teacher forcing); ``alignment`` (T_tgt,) int, the source position that target
t copies, -1 where it copies none; ``sentinel`` (T_tgt,) bool, optional: the aligned positions that
are T5 sentinels (a target <extra_id_k> aligned to the source's <extra_id_k>).

Scores per (layer, head), pooled over sentences (sums of hits over sums of counts), after the
alignment-head analyses of NMT (Bahdanau et al. 2015; Voita et al. 2019, "Analyzing Multi-Head
Self-Attention", sec. 6, who score an encoder-decoder head by how often its argmax is the aligned
source token):
- ``align_acc``: share of aligned target positions t whose argmax_s A[t, s] is alignment[t]
  (ties to the lowest s); ``align_acc:low`` / ``align_acc:high``: percentile bootstrap interval over
  sentences (`probes.heads.bootstrap_ratio`: the ratio of sums, resampled sentence-wise);
- ``align_mass``: mean A[t, alignment[t]] over aligned t;
- ``entropy``: mean over all target rows of H(A[t]) / log T_src (0 = one source token, 1 =
  uniform); sentences with T_src = 1 add no rows;
- ``monotonic``: over successive aligned target positions t < t' (in target order, the unaligned
  ones skipped), the share whose argmax source positions do not decrease;
- ``sentinel_acc`` (only when some sentence marks sentinels): ``align_acc`` restricted to them.
A score with nothing to count (no aligned positions, no pairs) is NaN.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .heads import bootstrap_ratio

SCORES = ("align_acc", "align_mass", "entropy", "monotonic", "sentinel_acc")
COLUMNS = ["model", "layer", "head", "score", "value"]
_TINY = 1e-30  # log(max(p, tiny)) makes 0 log 0 = 0


@dataclass(frozen=True)
class CrossSentence:
    """One sentence's cross-attention maps and alignment (see the module docstring for shapes)."""

    attn: np.ndarray  # (L, H, T_tgt, T_src) rows sum to 1
    alignment: np.ndarray  # (T_tgt,) int, -1 where the target copies no source position
    sentinel: np.ndarray | None = None  # (T_tgt,) bool, True on aligned T5 sentinels
    sent_id: str = ""


def _check(s: CrossSentence, tol: float, where: str) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(s.attn, dtype=np.float64)
    if A.ndim != 4:
        raise ValueError(f"{where}: attn must be (L, H, T_tgt, T_src), got shape {A.shape}")
    T, S = A.shape[2:]
    align = np.asarray(s.alignment)
    if align.shape != (T,) or align.dtype.kind not in "iu":
        raise ValueError(f"{where}: alignment must be ({T},) int like attn's target axis, got {align.shape} {align.dtype}")
    if ((align < -1) | (align >= S)).any():
        raise ValueError(f"{where}: alignment values must be -1 or source positions in [0, {S}), got {align.tolist()}")
    tot = A.sum(-1)
    if not (np.isfinite(A).all() and (A >= 0).all() and (np.abs(tot - 1) <= tol).all()):
        raise ValueError(f"{where}: attention rows must be non-negative and sum to 1 within {tol}")
    if s.sentinel is not None and np.shape(s.sentinel) != (T,):
        raise ValueError(f"{where}: sentinel must be ({T},) bool, got shape {np.shape(s.sentinel)}")
    return A, align.astype(np.int64)


class CrossAttentionStats:
    """Streaming accumulator of the cross-attention head scores (module docstring).

    Learned state: ``n_sentences_``, and per sentence (S, L*H) hit / count arrays for the bootstrap.
    """

    def __init__(self, n_boot: int = 1000, seed: int = 0, ci: float = 0.95, row_tolerance: float = 2e-3):
        self.n_boot = n_boot
        self.seed = seed
        self.ci = ci
        self.row_tolerance = row_tolerance

    def update(self, s: CrossSentence) -> "CrossAttentionStats":
        where = f"sentence {s.sent_id or getattr(self, 'n_sentences_', 0)}"
        A, align = _check(s, self.row_tolerance, where)
        L, H, T, S = A.shape
        if not hasattr(self, "shape_"):
            self.shape_ = (L, H)
            self.n_sentences_ = 0
            self.sums_ = {k: np.zeros((L, H)) for k in ("mass", "ent", "ent_n", "mono", "mono_n", "sent", "sent_n")}
            self.hits_: list[np.ndarray] = []
            self.counts_: list[float] = []
            self.has_sentinels_ = False
        elif self.shape_ != (L, H):
            raise ValueError(f"{where}: {L} layers x {H} heads, earlier sentences had {self.shape_}")
        am = A.argmax(-1)  # (L, H, T)
        t = np.flatnonzero(align >= 0)
        hit = am[..., t] == align[t]  # (L, H, n_aligned)
        self.hits_.append(hit.sum(-1).reshape(-1).astype(np.float64))
        self.counts_.append(float(len(t)))
        sums = self.sums_
        sums["mass"] += A[..., t, align[t]].sum(-1)
        if S > 1:
            sums["ent"] += (-(A * np.log(np.maximum(A, _TINY))).sum(-1) / np.log(S)).sum(-1)
            sums["ent_n"] += T
        if len(t) > 1:
            sums["mono"] += (np.diff(am[..., t], axis=-1) >= 0).sum(-1)
            sums["mono_n"] += len(t) - 1
        if s.sentinel is not None:
            self.has_sentinels_ = True
            st = np.asarray(s.sentinel, dtype=bool)[t]
            sums["sent"] += hit[..., st].sum(-1)
            sums["sent_n"] += int(st.sum())
        self.n_sentences_ += 1
        return self

    def score_arrays(self) -> dict[str, np.ndarray]:
        """Score name -> (L, H) array (NaN where nothing was counted)."""
        if not hasattr(self, "shape_"):
            raise ValueError("CrossAttentionStats: no sentences; call update() first")
        L, H = self.shape_
        hits, counts = np.stack(self.hits_), np.array(self.counts_)  # (N, L*H), (N,)
        sums = self.sums_
        with np.errstate(invalid="ignore", divide="ignore"):
            out = {"align_acc": hits.sum(0).reshape(L, H) / counts.sum()}
            if self.n_boot > 0:
                low, high = bootstrap_ratio(hits, np.repeat(counts[:, None], L * H, 1), self.n_boot, self.seed, self.ci)
                out["align_acc:low"], out["align_acc:high"] = low.reshape(L, H), high.reshape(L, H)
            out["align_mass"] = sums["mass"] / counts.sum()
            out["entropy"] = sums["ent"] / sums["ent_n"]
            out["monotonic"] = sums["mono"] / sums["mono_n"]
            if self.has_sentinels_:
                out["sentinel_acc"] = sums["sent"] / sums["sent_n"]
        return out

    def finalize(self, model: str = "model") -> pd.DataFrame:
        """The ``cross_heads`` table: (model, layer, head, score, value), one row per head and score."""
        scores = self.score_arrays()
        L, H = self.shape_
        layer, head = np.divmod(np.arange(L * H), H)
        frames = [pd.DataFrame({"model": model, "layer": layer, "head": head, "score": name,
                                "value": arr.reshape(-1)}) for name, arr in scores.items()]
        return pd.concat(frames, ignore_index=True)[COLUMNS]
