"""Figures of the Objectives page (the zoo: systems that differ only in their pretraining objective,
with pretraining seeds; workbench/analyses/zoo.py): per task, the probing score by layer of every
system with its multi-bootstrap band (Sellam et al. 2022, "The MultiBERTs"); the share of heads per primary
role of each system; linear CKA (Kornblith et al. 2019) between two systems' layers beside each
system's seed-to-seed CKA, the yardstick a cross-system similarity is read against."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.heads import role_colors
from workbench.figures.layers import PALETTE

X_AXES = {"layer": "layer (0 = embeddings)", "depth": "relative depth (layer / L)"}


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def zoo_layer_figure(df: pd.DataFrame, task: str, x: Literal["layer", "depth"] = "layer",
                     metric: str = "micro F1") -> go.Figure:
    """Score against layer for every system on one figure (one task of `views.zoo_layer_scores`): one
    line per system (named by the system) and, where it has one, a band ci_low..ci_high (the
    multi-bootstrap over seeds x items; a trace named "<system> interval", out of the legend), and where
    the frame has a `floor` column, the untrained architecture's scores as a dashed line of the system's
    colour ("<system> untrained", in the system's legend group, out of the legend).
    x = "depth" puts layer / L on the x axis, for systems of different depths."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {list(X_AXES)}, got {x!r}")
    df = df[df["task"] == task]
    fig = go.Figure()
    for i, system in enumerate(dict.fromkeys(df["system"])):
        g = df[df["system"] == system].sort_values("layer")
        color = PALETTE[i % len(PALETTE)]
        if g["ci_low"].notna().any():
            band = g.dropna(subset=["ci_low", "ci_high"])
            fig.add_trace(go.Scatter(x=np.r_[band[x], band[x][::-1]], y=np.r_[band["ci_high"], band["ci_low"][::-1]],
                                     fill="toself", fillcolor=_rgba(color, 0.18), line=dict(width=0),
                                     name=f"{system} interval", legendgroup=system, showlegend=False,
                                     hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=g[x], y=g["value"], mode="lines+markers", name=system, legendgroup=system, line=dict(color=color),
            customdata=np.c_[g["layer"], g["ci_low"], g["ci_high"]],
            hovertemplate=f"{system} layer %{{customdata[0]}}: %{{y:.3f}} "
                          "[%{customdata[1]:.3f}, %{customdata[2]:.3f}]<extra></extra>"))
        if "floor" in g and g["floor"].notna().any():
            f = g.dropna(subset=["floor"])
            fig.add_trace(go.Scatter(
                x=f[x], y=f["floor"], mode="lines", name=f"{system} untrained", legendgroup=system, showlegend=False,
                line=dict(color=color, dash="dash", width=1), customdata=np.c_[f["layer"], f["floor_low"], f["floor_high"]],
                hovertemplate=f"{system} untrained, layer %{{customdata[0]}}: %{{y:.3f}} "
                              "[%{customdata[1]:.3f}, %{customdata[2]:.3f}]<extra></extra>"))
    floors = "floor" in df and df["floor"].notna().any()
    return fig.update_layout(title=f"{task}: {metric} by layer, every system (band: multi-bootstrap 95% interval "
                                   "over seeds x items" + ("; dashed: the untrained architecture" if floors else "")
                                   + ")",
                             xaxis_title=X_AXES[x], yaxis_title=metric, height=400)


def zoo_roles_figure(df: pd.DataFrame) -> go.Figure:
    """Stacked bars: per system (x), the mean share of its heads per primary role over its seeds
    (`views.zoo_role_composition`), one trace per role, error bars from the seeds-only interval."""
    fig = go.Figure()
    colors = role_colors(df["role"].astype(str))
    systems = list(dict.fromkeys(df["system"]))
    for role in sorted(df["role"].unique()):
        g = df[df["role"] == role].set_index("system").reindex(systems)
        err = dict(type="data", array=(g["ci_high"] - g["value"]).fillna(0),
                   arrayminus=(g["value"] - g["ci_low"]).fillna(0), thickness=1)
        fig.add_trace(go.Bar(x=systems, y=g["value"], name=role, marker_color=colors[str(role)], error_y=err))
    return fig.update_layout(title="Share of heads per primary role (mean over seeds; error bars: seeds-only "
                                   "interval)", barmode="stack", xaxis_title="system", yaxis_title="share of heads",
                             height=400)


def zoo_cka_figure(cross: np.ndarray, system_a: str, system_b: str, own_a: np.ndarray | None = None,
                   own_b: np.ndarray | None = None) -> go.Figure:
    """CKA between system_a's layers (rows) and system_b's (columns), averaged over their seed pairs,
    beside each system's own seed-to-seed matrix (the yardstick; a panel is left out without it), one
    colour scale 0..1 for all panels (`views.zoo_cka_matrix`)."""
    panels = [(f"{system_a} seeds vs {system_a} seeds", own_a, system_a, system_a)] if own_a is not None else []
    panels.append((f"{system_a} vs {system_b} (seed-averaged)", cross, system_a, system_b))
    if own_b is not None:
        panels.append((f"{system_b} seeds vs {system_b} seeds", own_b, system_b, system_b))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.08)
    for c, (_, m, rows, cols) in enumerate(panels, start=1):
        fig.add_trace(go.Heatmap(z=m, zmin=0, zmax=1, colorscale="Magma", showscale=c == len(panels),
                                 colorbar=dict(title="CKA"), name=f"{rows} vs {cols}",
                                 hovertemplate=f"{rows} layer %{{y}} / {cols} layer %{{x}}: %{{z:.3f}}<extra></extra>"),
                      1, c)
        fig.update_xaxes(title_text=f"{cols} layer", dtick=1, row=1, col=c)
        fig.update_yaxes(title_text=f"{rows} layer", dtick=1, autorange="reversed", row=1, col=c)
    return fig.update_layout(title=f"Linear CKA: {system_a} vs {system_b}, beside each system's seeds", height=420)
