"""Figures of the Heads page: the layer x head grid (by role or by score), best head per relation,
and the 2-D map of heads (Clark et al. 2019, Fig. 6)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.figures.layers import PALETTE

ROLE_COLORS = {"none": "#e6e6e6", "broad": "#bcbd22", "sink": "#7f7f7f", "positional": "#1f77b4",
               "previous_token": "#17becf", "syntactic": "#d62728", "induction": "#9467bd",
               "rare_token": "#ff7f0e"}


# Subtypes of one family (syntactic:nsubj, syntactic:det, ...) each get their own colour: the
# family's colour for the first, then these, in order (none of them a base role's colour).
SUBTYPE_COLORS = ("#8c564b", "#e377c2", "#2ca02c", "#ff9896", "#98df8a", "#c49c94", "#f7b6d2",
                  "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
                  "#e6550d", "#31a354", "#756bb1", "#636363")


def role_colors(roles) -> dict[str, str]:
    """A colour per role name: base roles by ROLE_COLORS; the subtypes of a family (`family:subtype`)
    told apart, the first in the family's colour and the rest from SUBTYPE_COLORS; anything else
    from the palette."""
    out, used = {}, {}
    for i, role in enumerate(sorted(dict.fromkeys(roles))):
        if role in ROLE_COLORS:
            out[role] = ROLE_COLORS[role]
            continue
        family = role.split(":")[0]
        k = used.get(family, 0)
        used[family] = k + 1
        if family in ROLE_COLORS:
            out[role] = ROLE_COLORS[family] if k == 0 else SUBTYPE_COLORS[(k - 1) % len(SUBTYPE_COLORS)]
        else:
            out[role] = PALETTE[i % len(PALETTE)]
    return out


def head_grid_figure(grid, title: str | None = None, colorscale: str = "Viridis") -> go.Figure:
    """Heatmap of a HeadGrid: layers on y (0 at the top), heads on x. A categorical grid (roles) gets
    one discrete colour per category; NaN cells (pruned heads) stay blank."""
    z = grid.values
    L, H = z.shape
    title = title or f"{grid.model}: {grid.score}"
    common = dict(x=list(range(H)), y=list(range(L)), xgap=1, ygap=1)
    if grid.categories:
        k = len(grid.categories)
        colors = role_colors(grid.categories)
        scale = []
        for i, c in enumerate(grid.categories):   # a step colour scale: code i -> colour i
            scale += [[i / k, colors[c]], [(i + 1) / k, colors[c]]]
        trace = go.Heatmap(z=z, text=grid.labels, zmin=-0.5, zmax=k - 0.5, colorscale=scale,
                           colorbar=dict(tickvals=list(range(k)), ticktext=list(grid.categories)),
                           hovertemplate="layer %{y} head %{x}: %{text}<extra></extra>", **common)
    else:
        trace = go.Heatmap(z=z, colorscale=colorscale, colorbar=dict(title=grid.score),
                           hovertemplate="layer %{y} head %{x}: %{z:.3f}<extra></extra>", **common)
    fig = go.Figure(trace)
    return fig.update_layout(title=title, xaxis_title="head", yaxis_title="layer",
                             yaxis=dict(autorange="reversed", dtick=1 if L <= 24 else None),
                             xaxis=dict(dtick=1 if H <= 24 else None),
                             height=max(300, 28 * L + 120), width=None)


def relations_figure(df: pd.DataFrame) -> go.Figure:
    """Best head per dependency relation (test accuracy with CI) against the best fixed-offset
    baseline (Clark et al. 2019, Table 1 style): horizontal bars sorted by the head's accuracy, so
    forty relations stay readable at page width; the label says layer-head."""
    df = df.sort_values("test_acc", ascending=True, kind="stable")
    labels = [f"{r} ({d})" if "direction" in df else r for r, d in zip(df["relation"], df.get("direction", df["relation"]))]
    hover = [f"layer {l} head {h}" for l, h in zip(df["best_layer"], df["best_head"])]
    err = dict(type="data", array=df["ci_high"] - df["test_acc"], arrayminus=df["test_acc"] - df["ci_low"]) \
        if {"ci_low", "ci_high"} <= set(df.columns) else None
    fig = go.Figure([
        go.Bar(y=labels, x=df["baseline_acc"], name="offset baseline", orientation="h", marker_color=PALETTE[7],
               hovertext=[f"offset {o}" for o in df["baseline_offset"]]),
        go.Bar(y=labels, x=df["test_acc"], name="best head", orientation="h", error_x=err, marker_color=PALETTE[3],
               text=[f"{l}-{h}" for l, h in zip(df["best_layer"], df["best_head"])], textposition="outside",
               hovertext=hover),
    ])
    return fig.update_layout(title="Best head per relation (label = layer-head)", barmode="group",
                             xaxis=dict(title="accuracy", range=[0, 1.1]), height=max(320, 26 * len(df) + 120),
                             legend=dict(orientation="h", y=1.02, yanchor="bottom"))


def head_map_figure(df: pd.DataFrame, title: str = "Heads by attention similarity (MDS)") -> go.Figure:
    """Scatter of the heads' 2-D embedding, coloured by primary role, labelled layer-head."""
    fig = go.Figure()
    colors = role_colors(df["role"].astype(str))
    for role, g in df.groupby("role"):
        fig.add_trace(go.Scatter(x=g["x"], y=g["y"], mode="markers", name=role or "?",
                                 marker=dict(size=9, color=colors[str(role)], line=dict(width=0.5, color="#333")),
                                 text=[f"L{l}-H{h}" for l, h in zip(g["layer"], g["head"])],
                                 hovertemplate="%{text}<extra>" + (role or "") + "</extra>"))
    if len(df) <= 200:  # layer labels are readable only on small maps
        fig.add_trace(go.Scatter(x=df["x"], y=df["y"], mode="text", text=df["layer"].astype(str),
                                 textposition="top center", textfont=dict(size=8), showlegend=False,
                                 hoverinfo="skip"))
    return fig.update_layout(title=title, height=480, xaxis=dict(showticklabels=False),
                             yaxis=dict(showticklabels=False, scaleanchor="x"))

