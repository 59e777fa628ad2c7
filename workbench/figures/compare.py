"""Figures of the Pruning and Finetuned-vs-frozen pages: pruning curves (Michel et al. 2019, Fig. 3
style), speed and size of pruned models, frozen vs finetuned scores, CKA (Kornblith et al. 2019)
matrix and per-layer diagonal, probing deltas per layer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.layers import PALETTE


def pruning_curves_figure(df: pd.DataFrame) -> go.Figure:
    """Metric against the fraction of heads pruned, one line per (model, method), +-1 std band."""
    fig = go.Figure()
    for i, ((model, method), g) in enumerate(df.groupby(["model", "method"])):
        g = g.sort_values("fraction")
        color = PALETTE[i % len(PALETTE)]
        name = f"{model} {method}" if df["model"].nunique() > 1 else method
        if g["std"].fillna(0).gt(0).any():
            fig.add_trace(go.Scatter(x=np.r_[g["fraction"], g["fraction"][::-1]],
                                     y=np.r_[g["value"] + g["std"], (g["value"] - g["std"])[::-1]],
                                     fill="toself", line=dict(width=0), fillcolor=color, opacity=0.2,
                                     showlegend=False, hoverinfo="skip", legendgroup=name))
        fig.add_trace(go.Scatter(x=g["fraction"], y=g["value"], mode="lines+markers", name=name,
                                 line=dict(color=color), legendgroup=name))
    metric = ", ".join(df["metric"].unique())
    return fig.update_layout(title="Pruning curves", xaxis_title="fraction of heads pruned",
                             yaxis_title=metric, height=400)


def speed_figure(df: pd.DataFrame) -> go.Figure:
    """Parameters, size on disk and throughput of each pruned variant, relative to the first row."""
    cols = [c for c in ("params", "bytes", "tokens_per_s") if c in df]
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=cols)
    for c, col in enumerate(cols, start=1):
        fig.add_trace(go.Bar(x=df["variant"], y=df[col], marker_color=PALETTE[c - 1], showlegend=False,
                             text=[f"{v:,.0f}" for v in df[col]]), 1, c)
    return fig.update_layout(title="Pruned models: size and speed", height=340)


def fvf_figure(df: pd.DataFrame) -> go.Figure:
    """Frozen vs finetuned: grouped bars per task (one group per setting) with CIs. The table's
    "diff:<setting>" rows (finetuned minus frozen, another scale) are left out of the bars; rows
    without a value are skipped."""
    fig = go.Figure()
    df = df[~df["setting"].astype(str).str.startswith("diff:")].dropna(subset=["value"])
    for i, (setting, g) in enumerate(df.groupby("setting", sort=False)):
        label = g["model"] + " " + g["task"] + " " + g["metric"] if df["model"].nunique() > 1 else g["task"] + " " + g["metric"]
        err = dict(type="data", array=g["ci_high"] - g["value"], arrayminus=g["value"] - g["ci_low"]) \
            if "ci_high" in g and g["ci_high"].notna().any() else None
        fig.add_trace(go.Bar(x=label, y=g["value"], name=setting, error_y=err, marker_color=PALETTE[i % len(PALETTE)]))
    return fig.update_layout(title="Frozen vs finetuned", barmode="group", yaxis_title="score", height=380)


def cka_heatmap(m: np.ndarray, model_a: str, model_b: str, kind: str = "linear") -> go.Figure:
    """CKA(layer i of A, layer j of B) as a heatmap (layer 0 = embeddings)."""
    fig = go.Figure(go.Heatmap(z=m, colorscale="Magma", zmin=0, zmax=1, colorbar=dict(title="CKA"),
                               hovertemplate=f"{model_a} layer %{{y}} / {model_b} layer %{{x}}: %{{z:.3f}}<extra></extra>"))
    return fig.update_layout(title=f"{kind} CKA: {model_a} vs {model_b}", xaxis_title=f"{model_b} layer",
                             yaxis_title=f"{model_a} layer", yaxis=dict(autorange="reversed"),
                             height=460)


def cka_diagonal_figure(m: np.ndarray, model_a: str, model_b: str) -> go.Figure:
    """CKA between the same layer of both models (the diagonal): where finetuning changed the model."""
    k = min(m.shape)
    d = np.diag(m[:k, :k])
    fig = go.Figure(go.Scatter(x=list(range(k)), y=d, mode="lines+markers", line=dict(color=PALETTE[0])))
    return fig.update_layout(title=f"Per-layer CKA, {model_a} vs {model_b}", xaxis_title="layer",
                             yaxis_title="CKA", yaxis=dict(range=[0, 1.05]), height=340)


def probing_delta_figure(df: pd.DataFrame, model_a: str, model_b: str) -> go.Figure:
    """Probing score of model_b minus model_a per layer, one line per task."""
    fig = go.Figure()
    for i, (task, g) in enumerate(df.groupby("task")):
        fig.add_trace(go.Scatter(x=g["layer"], y=g["delta"], mode="lines+markers", name=task,
                                 line=dict(color=PALETTE[i % len(PALETTE)])))
    fig.add_hline(y=0, line=dict(color="#999", dash="dot"))
    return fig.update_layout(title=f"Probing delta: {model_b} - {model_a}", xaxis_title="layer",
                             yaxis_title="score difference", height=360)
