"""Figure of the emergence table: probe and head scores against the tokens a model has seen."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots


def emergence_figure(df: pd.DataFrame) -> go.Figure:
    """One panel per task_or_score of an `emergence` table, each metric a line of value against
    tokens seen (log x axis)."""
    groups = list(dict.fromkeys(df["task_or_score"]))
    fig = make_subplots(rows=len(groups) or 1, cols=1, subplot_titles=groups, shared_xaxes=False)
    for i, g in enumerate(groups, start=1):
        sub = df[df["task_or_score"] == g]
        for metric, m in sub.groupby("metric", sort=True):
            if metric == "best_layer":
                continue
            m = m.sort_values("tokens")
            fig.add_trace(go.Scatter(x=m["tokens"].clip(lower=1), y=m["value"], mode="lines+markers",
                                     name=f"{g}: {metric}", legendgroup=g), row=i, col=1)
        fig.update_xaxes(type="log", title_text="tokens seen", row=i, col=1)
    return fig.update_layout(height=260 * max(1, len(groups)), title="Emergence over pretraining checkpoints")
