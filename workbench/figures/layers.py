"""Figures of the Runs and Layers pages: training curves, per-layer probing scores, mixing weights,
the "classical NLP pipeline" summary (Tenney et al. 2019, Fig. 1), scores beside their baselines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def training_figure(df: pd.DataFrame) -> go.Figure:
    """One panel per metric; one line per (model, split) against the step."""
    metrics = list(dict.fromkeys(df["metric"]))
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=metrics)
    for c, metric in enumerate(metrics, start=1):
        for i, ((model, split), g) in enumerate(df[df["metric"] == metric].groupby(["model", "split"])):
            fig.add_trace(go.Scatter(x=g["step"], y=g["value"], mode="lines", name=f"{model} {split}",
                                     legendgroup=f"{model} {split}", showlegend=c == 1,
                                     line=dict(color=_color(i), dash="dot" if split != "train" else None)), 1, c)
        fig.update_xaxes(title_text="step", row=1, col=c)
    return fig.update_layout(title="Training curves", height=350)


def layer_scores_figure(df: pd.DataFrame, metric: str = "accuracy") -> go.Figure:
    """One panel per task; score against layer, one line per model with its CI as error bars."""
    tasks = sorted(df["task"].unique())
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=tasks, shared_xaxes=True)
    models = sorted(df["model"].unique())
    for t, task in enumerate(tasks):
        r, c = t // cols + 1, t % cols + 1
        for i, model in enumerate(models):
            g = df[(df["task"] == task) & (df["model"] == model)].sort_values("layer")
            err = None
            if {"ci_low", "ci_high"} <= set(g.columns) and g["ci_high"].notna().any():
                err = dict(type="data", array=g["ci_high"] - g["value"], arrayminus=g["value"] - g["ci_low"],
                           thickness=1, width=2)
            fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], mode="lines+markers", name=model,
                                     legendgroup=model, showlegend=t == 0, error_y=err,
                                     line=dict(color=_color(i))), r, c)
    fig.update_xaxes(title_text="layer", row=rows)
    return fig.update_layout(title=f"Probing {metric} per layer", height=300 * rows)


def cumulative_figure(probing: pd.DataFrame, metric: str | None = None) -> go.Figure:
    """Differential scores Delta_l of the cumulative probes (the gain of adding layer l to the scalar
    mix of layers 0..l-1; Tenney et al. 2019b, Fig. 1): one bar group per (model, task). `metric`
    defaults to the first "delta_*" metric of the `probing` table."""
    df = probing[probing["mode"] == "cumulative"]
    deltas = sorted(m for m in df["metric"].unique() if m.startswith("delta_"))
    metric = metric or (deltas[0] if deltas else "delta_micro_f1")
    df = df[df["metric"] == metric]
    fig = go.Figure()
    for i, ((model, task), g) in enumerate(df.groupby(["model", "task"])):
        g = g.sort_values("layer")
        fig.add_trace(go.Bar(x=g["layer"], y=g["value"], name=f"{task} ({model})", marker_color=_color(i)))
    return fig.update_layout(title=f"Cumulative probes: {metric} per layer added", xaxis_title="layer",
                             yaxis_title=metric, barmode="group", height=380)


def mix_weights_figure(df: pd.DataFrame) -> go.Figure:
    """Heatmap of scalar-mix weights: task x layer (one model)."""
    wide = df.pivot_table(index="task", columns="layer", values="weight")
    return go.Figure(go.Heatmap(z=wide.to_numpy(), x=wide.columns, y=wide.index, colorscale="Blues",
                                colorbar=dict(title="weight"), hovertemplate="%{y} layer %{x}: %{z:.3f}<extra></extra>")
                     ).update_layout(title="Scalar-mix weights", xaxis_title="layer", height=120 + 40 * len(wide))


def pipeline_figure(mix: pd.DataFrame, summary: pd.DataFrame) -> go.Figure:
    """Tenney et al. 2019, Fig. 1 style, for one model: a row per task with its mixing weights as bars
    and two markers, the expected layer E_s[l] = sum_l s_l l (from the mix) and the center of
    gravity E_D[l] = sum_l l Delta_l / sum_l Delta_l (from cumulative scores). Tasks are ordered by
    expected layer, which draws the "pipeline"."""
    order = summary.sort_values("expected_layer")["task"].tolist() if "expected_layer" in summary else \
        sorted(mix["task"].unique())
    order = [t for t in order if t in set(mix["task"])] or sorted(mix["task"].unique())
    fig = make_subplots(rows=len(order), cols=1, shared_xaxes=True, vertical_spacing=0.02,
                        row_titles=order)
    for r, task in enumerate(order, start=1):
        g = mix[mix["task"] == task].sort_values("layer")
        fig.add_trace(go.Bar(x=g["layer"], y=g["weight"], marker_color=PALETTE[0], name="mix weight",
                             showlegend=r == 1, legendgroup="w"), r, 1)
        s = summary[summary["task"] == task]
        top = float(g["weight"].max()) if len(g) else 1.0
        for col, sym, color in (("expected_layer", "diamond", PALETTE[3]), ("center_of_gravity", "circle", PALETTE[4])):
            if col in s and s[col].notna().any():
                fig.add_trace(go.Scatter(x=[float(s[col].iloc[0])], y=[top * 1.1], mode="markers",
                                         marker=dict(symbol=sym, size=11, color=color), name=col.replace("_", " "),
                                         showlegend=r == 1, legendgroup=col,
                                         hovertemplate=f"{task} {col}: %{{x:.2f}}<extra></extra>"), r, 1)
        fig.update_yaxes(showticklabels=False, row=r, col=1)
    fig.update_xaxes(title_text="layer", row=len(order), col=1)
    return fig.update_layout(title="Where each task is solved (expected layer, center of gravity)",
                             height=90 * len(order) + 140, bargap=0.1)


def summary_figure(table: pd.DataFrame, model: str) -> go.Figure:
    """Per task, the score beside its baselines: lexical (layer 0), control task, best single layer,
    scalar mix; selectivity (= score - control, Hewitt and Liang 2019) in the hover and labels."""
    t = table[table["model"] == model]
    fig = go.Figure()
    for i, col in enumerate(c for c in ("lexical", "control", "best", "mix") if c in t):
        fig.add_trace(go.Bar(x=t["task"], y=t[col], name=col, marker_color=_color(i + 2)))
    if "selectivity" in t:
        fig.add_trace(go.Scatter(x=t["task"], y=t[[c for c in ("mix", "best") if c in t]].max(axis=1) + 0.03,
                                 mode="text", text=[f"sel {v:.2f}" if np.isfinite(v) else "" for v in t["selectivity"]],
                                 showlegend=False))
    return fig.update_layout(title=f"{model}: scores and baselines", barmode="group", yaxis_title="score",
                             height=380)


def predictions_figure(df: pd.DataFrame, title: str) -> go.Figure:
    """Horizontal bars of token probabilities (one group per mask when a `mask` column exists)."""
    fig = go.Figure()
    groups = df.groupby("mask") if "mask" in df else [(None, df)]
    for i, (m, g) in enumerate(groups):
        fig.add_trace(go.Bar(x=g["prob"], y=[f"{t!r}" for t in g["token"]], orientation="h",
                             name=f"[MASK] {m}" if m is not None else "next token", marker_color=_color(i)))
    return fig.update_layout(title=title, xaxis_title="probability", yaxis=dict(autorange="reversed"),
                             height=120 + 28 * len(df))
