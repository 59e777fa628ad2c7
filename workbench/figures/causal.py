"""Figures of the causal probes: structural probes (Hewitt and Manning 2019: UUAS and root accuracy
per layer), amnesic probing (Elazar et al. 2021: the LM-loss increase of an eraser against its random
control) and head gating (a role's LM-loss increase against random heads of the same number; each
head's increase as a layer x head grid).

Inputs are the frames of `workbench.presentation.views` (`structural_summary_frame`,
`amnesic_summary_frame`, `gating_summary_frame`, `passport_grid`); none reads a file.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.heads import head_grid_figure
from workbench.figures.layers import PALETTE


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def structural_figure(summary: pd.DataFrame, metrics: Mapping[str, tuple[str, str]]) -> go.Figure:
    """Structural probes (Hewitt and Manning 2019) from `views.structural_summary_frame`: a panel per
    task of `metrics` (task -> (headline metric, Spearman correlation), `views.STRUCTURAL_METRICS`)
    with its headline metric per layer (UUAS for distance, root accuracy for depth; solid, the
    min-max over seeds as error bars) and its Spearman correlation (DSpr, NSpr; dotted), a colour per model."""
    tasks = [t for t in metrics if (summary["task"] == t).any()]
    fig = make_subplots(rows=1, cols=len(tasks), shared_yaxes=True,
                        subplot_titles=[f"{t}: {' / '.join(metrics[t])}" for t in tasks])
    for c, task in enumerate(tasks, start=1):
        for i, model in enumerate(sorted(summary["model"].unique())):
            for metric, dash in zip(metrics[task], (None, "dot")):
                g = summary[(summary["task"] == task) & (summary["model"] == model) & (summary["metric"] == metric)]
                g = g.sort_values("layer")
                err = dict(type="data", array=g["max"] - g["value"], arrayminus=g["value"] - g["min"], thickness=1)
                fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], mode="lines+markers", name=f"{model} {metric}",
                                         error_y=err if dash is None else None,
                                         line=dict(color=_color(i), dash=dash)), 1, c)
        fig.update_xaxes(title_text="layer", row=1, col=c)
    return fig.update_layout(title="Structural probes per layer (Hewitt and Manning 2019)", yaxis_title="score",
                             height=380)


def amnesic_figure(summary: pd.DataFrame) -> go.Figure:
    """Amnesic probing (Elazar et al. 2021) from `views.amnesic_summary_frame`: a panel per property
    with the LM-loss increase per layer when the property is erased (solid), when random directions
    that move the vectors as far are erased (the matched control, dashed, same colour) and, where the
    run has it, when as many uniformly random directions are (same rank only, dotted): the gap to the
    matched control is the evidence that the model uses it. A model without LM rows (its LM head is
    untrained) is drawn with the downstream probe instead: the intact model's last-layer probe read on
    the erased run."""
    metric = "lm_loss_delta" if summary["lm_loss_delta"].notna().any() else "last_layer_acc"
    tasks = sorted(summary["task"].unique())
    fig = make_subplots(rows=1, cols=len(tasks), subplot_titles=tasks, shared_yaxes=True)
    for c, task in enumerate(tasks, start=1):
        for i, ((model, eraser), g) in enumerate(summary.groupby(["model", "eraser"])):
            g = g[g["task"] == task].sort_values("layer")
            lines = ((metric, eraser, None), (f"{metric}_matched", f"{eraser} matched random", "dash"),
                     (f"{metric}_same_rank", f"{eraser} random, same rank", "dot"))
            for col, label, dash in (line for line in lines if line[0] in g):
                fig.add_trace(go.Scatter(x=g["layer"], y=g[col], mode="lines+markers", name=f"{model} {label}",
                                         legendgroup=f"{model} {label}", showlegend=c == 1,
                                         line=dict(color=_color(i), dash=dash)), 1, c)
        fig.update_xaxes(title_text="layer erased", row=1, col=c)
    what = "LM-loss increase" if metric == "lm_loss_delta" else "last-layer probe accuracy"
    return fig.update_layout(title=f"Amnesic probing: {what}, property erased vs random directions moved as far",
                             yaxis_title=metric, height=380)


def gating_figure(summary: pd.DataFrame, model: str) -> go.Figure:
    """Head gating of one model from `views.gating_summary_frame`: per role / family unit (bars) its
    LM-loss increase and each property's largest probe-accuracy drop, beside random heads of the same
    number (grey marker at their mean, the bar from their min to max)."""
    s = summary[summary["model"] == model]
    panels = [("lm", "lm_loss_delta")] + [(t, "max_acc_drop") for t in sorted(set(s["task"]) - {"lm"})]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[
        "LM loss increase" if t == "lm" else f"{t}: largest accuracy drop" for t, _ in panels])
    for c, (task, metric) in enumerate(panels, start=1):
        g = s[(s["task"] == task) & (s["metric"] == metric)]
        x = [f"{u}: {n} ({k})" for u, n, k in zip(g["unit"], g["name"], g["n_gated"])]
        fig.add_trace(go.Bar(x=x, y=g["value"], name="role / family gated", marker_color=PALETTE[0],
                             showlegend=c == 1, legendgroup="unit"), 1, c)
        err = dict(type="data", array=g["random_max"] - g["random_mean"], arrayminus=g["random_mean"] - g["random_min"])
        fig.add_trace(go.Scatter(x=x, y=g["random_mean"], mode="markers", error_y=err, name="random heads, same number",
                                 marker=dict(color=PALETTE[7], size=9, symbol="diamond"), showlegend=c == 1,
                                 legendgroup="random"), 1, c)
    return fig.update_layout(title=f"{model}: gating head roles against random heads", height=420)


def passport_figure(grid, column: str = "lm_loss_delta") -> go.Figure:
    """Layer x head grid of one `head_passport` column of one model (`views.passport_grid`; default: the
    LM-loss increase when the head alone is gated), on a diverging scale centred at 0."""
    return head_grid_figure(grid, f"{grid.model}: {column} when the head alone is gated", "RdBu_r").update_traces(zmid=0)
