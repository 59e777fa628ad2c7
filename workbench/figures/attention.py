"""The attention of one head (or one layer's heads) on a sentence, with its dependency arcs.

Two views of a SentenceAttention (words, attn (L, H, n, n), arcs): a heatmap of one head with the
gold/parsed arcs marked on it (cell [dependent, head]), and BertViz-style lines (Vig 2019) from each
attending word (left) to each attended word (right). Lines are drawn with a few traces only: one
trace per (head, opacity bin) whose segments are separated by None, so 60 words x 16 heads stays
fast. Long sentences are cut to `max_words` (the page says so).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.figures.layers import PALETTE

MAX_WORDS = 60


def _cut(sa, max_words: int):
    n = min(len(sa.words), max_words)
    return sa.words[:n], [(d, h, lab) for d, h, lab in sa.arcs if d < n and h < n], n


def attention_heatmap(sa, layer: int, head: int, max_words: int = MAX_WORDS) -> go.Figure:
    """Heatmap of attn[layer, head] (row = attending word) over the first `max_words` words, with an
    open square on every dependency arc's cell (row = dependent, column = its head)."""
    words, arcs, n = _cut(sa, max_words)
    z = np.asarray(sa.attn[layer, head, :n, :n], dtype=np.float32)
    ticks = dict(tickmode="array", tickvals=list(range(n)), ticktext=words, tickfont=dict(size=9 if n > 30 else 11))
    fig = go.Figure(go.Heatmap(z=z, x=list(range(n)), y=list(range(n)), colorscale="Blues", zmin=0,
                               customdata=[[f"{words[i]} -> {words[j]}" for j in range(n)] for i in range(n)],
                               hovertemplate="%{customdata}: %{z:.3f}<extra></extra>",
                               colorbar=dict(title="attention")))
    if arcs:
        fig.add_trace(go.Scatter(x=[h for _, h, _ in arcs], y=[d for d, _, _ in arcs], mode="markers",
                                 marker=dict(symbol="square-open", size=max(6, 420 // max(n, 1)), color=PALETTE[3],
                                             line=dict(width=2)),
                                 text=[lab for _, _, lab in arcs], name="dependency arc",
                                 hovertemplate="%{text}<extra>arc</extra>"))
    side = max(360, 16 * n + 160)
    return fig.update_layout(title=f"Layer {layer}, head {head}", height=side,
                             xaxis=dict(title="attended word", tickangle=-60, **ticks),
                             yaxis=dict(title="attending word", autorange="reversed", **ticks),
                             legend=dict(orientation="h", y=1.02))


def _segments(mask: np.ndarray) -> tuple[list, list]:
    """x, y of line segments (0, -i) -> (1, -j) for the True cells of mask, None-separated."""
    i, j = np.nonzero(mask)
    xs = np.empty(3 * len(i), dtype=object)
    ys = np.empty(3 * len(i), dtype=object)
    xs[0::3], xs[1::3], xs[2::3] = 0.0, 1.0, None
    ys[0::3], ys[1::3], ys[2::3] = -i, -j, None
    return xs.tolist(), ys.tolist()


def attention_lines(sa, layer: int, heads=None, max_words: int = MAX_WORDS, threshold: float = 0.05,
                    n_bins: int = 4, show_arcs: bool = True) -> go.Figure:
    """BertViz-style lines for `heads` of `layer` (all by default): a line from word i (left) to
    word j (right) when attn >= threshold, its opacity by weight bin; one colour per head.
    Dependency arcs (dependent -> head) are drawn over them as dashed red lines."""
    words, arcs, n = _cut(sa, max_words)
    A = np.asarray(sa.attn[layer, :, :n, :n], dtype=np.float32)
    heads = list(range(A.shape[0])) if heads is None else list(heads)
    edges = np.linspace(threshold, 1.0, n_bins + 1)
    fig = go.Figure()
    for k, h in enumerate(heads):
        w = np.nan_to_num(A[h], nan=0.0)
        color = PALETTE[k % len(PALETTE)]
        first = True
        for b in range(n_bins):
            hi = edges[b + 1] if b < n_bins - 1 else np.inf
            mask = (w >= edges[b]) & (w < hi)
            if not mask.any():
                continue
            xs, ys = _segments(mask)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=1 + 2 * b / n_bins),
                                     opacity=0.25 + 0.75 * (b + 1) / n_bins, name=f"head {h}",
                                     legendgroup=f"head {h}", showlegend=first, hoverinfo="skip"))
            first = False
    if show_arcs and arcs:
        xs, ys = [], []
        for d, hd, _ in arcs:
            xs += [0.0, 1.0, None]
            ys += [-d, -hd, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=PALETTE[3], dash="dash", width=1.5),
                                 name="dependency arc (dependent -> head)", hoverinfo="skip"))
    ys = [-i for i in range(n)]
    fig.add_trace(go.Scatter(x=[-0.02] * n, y=ys, mode="text", text=words, textposition="middle left",
                             showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[1.02] * n, y=ys, mode="text", text=words, textposition="middle right",
                             showlegend=False, hoverinfo="skip"))
    return fig.update_layout(title=f"Layer {layer}: attention lines (weight >= {threshold})",
                             height=max(360, 18 * n + 140), xaxis=dict(visible=False, range=[-0.6, 1.6]),
                             yaxis=dict(visible=False), plot_bgcolor="white")
