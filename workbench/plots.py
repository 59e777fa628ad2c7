"""Plotly figure builders for the probing and head-analysis tables (for the report, docs and app).

Plain functions: tidy table in (docs/design.md "Result tables"), `plotly.graph_objects.Figure` out.
They never read private state, so any run's tables can be drawn again. Layer 0 is the embedding
layer throughout. Figures follow Tenney et al. 2019b (per-layer scores, differential scores and
mixing weights) and Clark et al. 2019 (head grids, relation accuracies, the MDS map of heads).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


def _seed_mean(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Rows with seed = -1 (mean over seeds with CI) where present, else the mean of the seeds."""
    agg = df[df["seed"] == -1]
    if len(agg):
        return agg
    return df.groupby(keys, as_index=False).agg(value=("value", "mean"), ci_low=("ci_low", "mean"),
                                                ci_high=("ci_high", "mean"))


def layer_scores_figure(probing: pd.DataFrame, metric: str = "micro_f1", mode: str = "single",
                        probe: str | None = None) -> go.Figure:
    """One line per (model, task): score of a probe on layer l alone, with its interval."""
    df = probing[(probing["mode"] == mode) & (probing["metric"] == metric)]
    if probe is not None:
        df = df[df["probe"] == probe]
    fig = go.Figure()
    for (model, task, pr), g in df.groupby(["model", "task", "probe"]):
        g = _seed_mean(g, ["layer"]).sort_values("layer")
        err = dict(type="data", symmetric=False, array=(g["ci_high"] - g["value"]).to_numpy(),
                   arrayminus=(g["value"] - g["ci_low"]).to_numpy())
        fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], mode="lines+markers", error_y=err,
                                 name=f"{task} ({model}, {pr})"))
    fig.update_layout(title=f"{mode} probes: {metric} per layer", xaxis_title="layer (0 = embeddings)",
                      yaxis_title=metric)
    return fig


def cumulative_figure(probing: pd.DataFrame, metric: str = "delta_micro_f1") -> go.Figure:
    """Differential scores delta_l of the cumulative probes, one bar group per task (Tenney 2019b Fig. 1)."""
    df = probing[(probing["mode"] == "cumulative") & (probing["metric"] == metric)]
    fig = go.Figure()
    for (model, task), g in df.groupby(["model", "task"]):
        g = g.sort_values("layer")
        fig.add_trace(go.Bar(x=g["layer"], y=g["value"], name=f"{task} ({model})"))
    fig.update_layout(title=f"cumulative probes: {metric}", xaxis_title="layer", yaxis_title=metric,
                      barmode="group")
    return fig


def mix_weights_figure(mix_weights: pd.DataFrame) -> go.Figure:
    """Heatmap task x layer of the scalar-mix weights s_l, averaged over seeds."""
    df = mix_weights.assign(row=mix_weights["task"] + " (" + mix_weights["model"] + ")")
    pivot = df.groupby(["row", "layer"])["weight"].mean().unstack("layer").sort_index()
    fig = go.Figure(go.Heatmap(z=pivot.to_numpy(), x=pivot.columns.tolist(), y=pivot.index.tolist(),
                               colorscale="Blues", colorbar_title="s_l"))
    fig.update_layout(title="scalar-mix weights", xaxis_title="layer", yaxis_title="task")
    return fig


def summary_figure(summary: pd.DataFrame) -> go.Figure:
    """Expected layer E_s and center of gravity E_delta per task (Tenney 2019b Fig. 1 summary)."""
    fig = go.Figure()
    for metric in ("expected_layer", "center_of_gravity"):
        g = summary[summary["metric"] == metric]
        fig.add_trace(go.Scatter(x=g["value"], y=g["task"] + " (" + g["model"] + ")", mode="markers",
                                 name=metric, marker=dict(size=10)))
    fig.update_layout(title="where each task is solved", xaxis_title="layer", yaxis_title="task")
    return fig


def head_scores_figure(heads: pd.DataFrame, score: str, model: str | None = None) -> go.Figure:
    """Heatmap layer x head of one score of the `heads` table."""
    df = heads[heads["score"] == score]
    if model is not None:
        df = df[df["model"] == model]
    pivot = df.pivot_table(index="layer", columns="head", values="value", aggfunc="mean")
    fig = go.Figure(go.Heatmap(z=pivot.to_numpy(), x=pivot.columns.tolist(), y=pivot.index.tolist(),
                               colorscale="Viridis", colorbar_title=score))
    fig.update_layout(title=score, xaxis_title="head", yaxis_title="layer")
    return fig


def head_roles_figure(classes: pd.DataFrame, model: str | None = None) -> go.Figure:
    """Grid layer x head coloured by each head's primary role, all roles in the hover text."""
    df = classes if model is None else classes[classes["model"] == model]
    prim = df[df["primary"]] if "primary" in df else df.groupby(["layer", "head"], as_index=False).first()
    all_roles = df.groupby(["layer", "head"])["role"].apply(lambda r: ", ".join(sorted(r)))
    L, H = int(df["layer"].max()) + 1, int(df["head"].max()) + 1
    families = sorted({r.split(":")[0] for r in prim["role"]})
    code = {f: i for i, f in enumerate(families)}
    z = np.full((L, H), np.nan)
    text = np.full((L, H), "", dtype=object)
    for r in prim.itertuples():
        z[r.layer, r.head] = code[r.role.split(":")[0]]
        text[r.layer, r.head] = r.role
    hover = np.array([[f"L{l} H{h}: {all_roles.get((l, h), 'none')}" for h in range(H)] for l in range(L)])
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text",
                               colorscale="Turbo", showscale=False))
    fig.update_layout(title="primary role per head (" + ", ".join(families) + ")",
                      xaxis_title="head", yaxis_title="layer")
    return fig


def relations_figure(relations: pd.DataFrame, direction: str | None = None) -> go.Figure:
    """Best head's test accuracy (picked on dev) vs the fixed-offset baseline, per relation."""
    df = relations if direction is None else relations[relations["direction"] == direction]
    df = df.dropna(subset=["test_acc"])
    label = df["relation"] + " " + df["direction"] + " (" + df["model"] + ")"
    err = dict(type="data", symmetric=False, array=(df["ci_high"] - df["test_acc"]).to_numpy(),
               arrayminus=(df["test_acc"] - df["ci_low"]).to_numpy())
    fig = go.Figure([go.Bar(x=label, y=df["test_acc"], error_y=err, name="best head (test)",
                            hovertext="L" + df["best_layer"].astype(str) + " H" + df["best_head"].astype(str)),
                     go.Bar(x=label, y=df["baseline_acc"], name="best fixed offset (test)")])
    fig.update_layout(title="syntactic heads: picked on dev, scored on test", barmode="group",
                      yaxis_title="accuracy")
    return fig


def head_map_figure(similarity: pd.DataFrame, classes: pd.DataFrame | None = None) -> go.Figure:
    """MDS map of heads (Clark et al. 2019 Fig. 6): one point per head, coloured by layer."""
    df = similarity
    if classes is not None and "primary" in classes:
        prim = classes[classes["primary"]][["model", "layer", "head", "role"]]
        df = df.merge(prim, on=["model", "layer", "head"], how="left")
    text = "L" + df["layer"].astype(str) + " H" + df["head"].astype(str)
    if "role" in df:
        text = text + " " + df["role"].fillna("none")
    fig = go.Figure(go.Scatter(x=df["x"], y=df["y"], mode="markers", text=text, hoverinfo="text",
                               marker=dict(color=df["layer"], colorscale="Viridis", showscale=True,
                                           colorbar_title="layer", size=9)))
    fig.update_layout(title="heads by Jensen-Shannon distance (MDS)", xaxis_title="MDS 1", yaxis_title="MDS 2")
    return fig
