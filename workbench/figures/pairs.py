"""Figures of the minimal pairs (docs/behaviour.md; Marvin & Linzen 2018, Warstadt et al. 2020) and of
the structural probes' floors: every accuracy with its interval beside its floors on the same items,
and accuracy against the number of attractors (Linzen et al. 2016's difficulty axis).

Inputs are the frames of `workbench.presentation.views` (`pairs_accuracy_frame`,
`pairs_attractors_frame`, `structural_floors_frame`); none reads a file.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.layers import PALETTE

# how each floor is drawn beside the model's scores (grey shades, a symbol each)
FLOOR_STYLE = {"chance": ("#9e9e9e", "line-ew"), "frequency": ("#8d6e63", "diamond-open"),
               "bigram": ("#616161", "square-open"), "random_init": ("#212121", "x-thin-open"),
               "random_tree": ("#9e9e9e", "line-ew"), "chain": ("#8d6e63", "diamond-open"),
               "position": ("#616161", "square-open")}


def _err(g: pd.DataFrame) -> dict:
    return dict(type="data", array=(g["ci_high"] - g["value"]).clip(lower=0),
                arrayminus=(g["value"] - g["ci_low"]).clip(lower=0), thickness=1)


def pairs_figure(acc: pd.DataFrame, model: str, variant: str | None = None) -> go.Figure:
    """One model's accuracy per phenomenon (conditions pooled; `views.pairs_accuracy_frame`), a marker
    with its 95% interval per scorer, beside the floors on the same items: chance (a fair coin's range),
    the frequency and bigram floors and the random-init model (scored by the same scorer); a panel per
    suite. `variant` keeps one variant (original, nonce, template); None shows each as its own x entry."""
    df = acc[acc["model"] == model]
    if variant is not None:
        df = df[df["variant"] == variant]
    suites = list(dict.fromkeys(df["suite"]))
    fig = make_subplots(rows=1, cols=max(1, len(suites)), subplot_titles=suites, shared_yaxes=True)
    x_of = (lambda g: g["phenomenon"]) if variant is not None else (lambda g: g["phenomenon"] + " / " + g["variant"])
    shown: set[str] = set()
    for c, suite in enumerate(suites, start=1):
        s = df[df["suite"] == suite].sort_values(["phenomenon", "variant"])
        scorers = list(dict.fromkeys(s.loc[s["source"] == "model", "scorer"]))
        for i, scorer in enumerate(scorers):
            g = s[(s["source"] == "model") & (s["scorer"] == scorer)]
            fig.add_trace(go.Scatter(x=x_of(g), y=g["value"], error_y=_err(g), mode="markers", name=scorer,
                                     legendgroup=scorer, showlegend=scorer not in shown,
                                     marker=dict(color=PALETTE[i % len(PALETTE)], size=10)), row=1, col=c)
            shown.add(scorer)
        for floor, (color, symbol) in FLOOR_STYLE.items():
            g = s[s["source"] == floor]
            if not len(g):
                continue
            if set(scorers) <= set(g["scorer"]):   # every scorer has this floor on its own items: no pooled one
                g = g[g["scorer"] != ""]
            for scorer, h in g.groupby("scorer", sort=False):   # random_init, a subset scorer's: one per scorer
                name = f"floor: {floor}" + (f" ({scorer})" if scorer else "")
                fig.add_trace(go.Scatter(x=x_of(h), y=h["value"], error_y=_err(h), mode="markers", name=name,
                                         legendgroup=name, showlegend=name not in shown,
                                         marker=dict(color=color, symbol=symbol, size=11)), row=1, col=c)
                shown.add(name)
    fig.update_yaxes(range=[-0.05, 1.05], title_text="accuracy (good preferred)", row=1, col=1)
    return fig.update_layout(title=f"{model}: minimal pairs beside chance, frequency, bigram and random-init floors",
                             height=480, scattermode="group")


def attractors_figure(attr: pd.DataFrame, model: str) -> go.Figure:
    """One model's agreement accuracy against the number of attractors (`views.pairs_attractors_frame`):
    a line per phenomenon, variant and scorer with its interval, the random-init model's dotted beside it."""
    df = attr[(attr["model"] == model) & attr["source"].isin(["model", "random_init"])]
    fig = go.Figure()
    lines = df[["suite", "phenomenon", "variant", "scorer"]].drop_duplicates()
    for i, r in enumerate(lines.itertuples(index=False)):
        color = PALETTE[i % len(PALETTE)]
        for source, dash in (("model", None), ("random_init", "dot")):
            g = df[(df["source"] == source) & (df["suite"] == r.suite) & (df["phenomenon"] == r.phenomenon)
                   & (df["variant"] == r.variant) & (df["scorer"] == r.scorer)].sort_values("attractors")
            if not len(g):
                continue
            name = f"{r.phenomenon} ({r.variant}, {r.scorer})" + (" random init" if source != "model" else "")
            fig.add_trace(go.Scatter(x=g["attractors"], y=g["value"], error_y=_err(g), mode="lines+markers",
                                     name=name, line=dict(color=color, dash=dash)))
    fig.add_hline(y=0.5, line=dict(color="#9e9e9e", dash="dash"), annotation_text="chance")
    fig.update_xaxes(title_text="attractors (intervening nouns of the other number; 2 = 2 or more)", dtick=1)
    fig.update_yaxes(range=[-0.05, 1.05], title_text="accuracy")
    return fig.update_layout(title=f"{model}: agreement accuracy by number of attractors", height=420)


def structural_floors_figure(floors: pd.DataFrame, metric: str) -> go.Figure:
    """The structural probes' best-layer score of each model beside its four floors (random tree,
    chain, position, random init; `views.structural_floors_frame`), one metric, 95% intervals."""
    df = floors[floors["metric"] == metric]
    fig = go.Figure()
    for source in ("model", "random_tree", "chain", "position", "random_init"):
        g = df[df["source"] == source]
        if not len(g):
            continue
        color, symbol = ("#1f77b4", "circle") if source == "model" else FLOOR_STYLE[source]
        fig.add_trace(go.Scatter(x=g["model"] + " / " + g["task"], y=g["value"], error_y=_err(g), mode="markers",
                                 name=source if source == "model" else f"floor: {source}",
                                 marker=dict(color=color, symbol=symbol, size=11)))
    fig.update_yaxes(title_text=metric)
    return fig.update_layout(title=f"Structural probes ({metric}): best layer beside the four floors", height=420,
                             scattermode="group")


def probe_behaviour_figure(em: pd.DataFrame, model: str) -> go.Figure:
    """Probes against behaviour over pretraining (Zhang et al. 2021: do the probes saturate before the
    behaviour?): from an `emergence` table with minimal-pair rows, one model's best-layer probe scores
    (left) and its minimal-pair accuracy per phenomenon with its 95% interval (right, each phenomenon's
    bigram floor dotted in its colour, chance at 0.5), against tokens seen (log x axis)."""
    df = em[em["model"] == model]
    pairs = df[df["task_or_score"].str.startswith("pairs:")]
    probes = df[~df["task_or_score"].str.startswith("pairs:") & df["metric"].str.endswith("_best")]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["probes (best layer)", "minimal pairs (accuracy)"],
                        shared_xaxes=True)
    for i, (task, g) in enumerate(probes.groupby("task_or_score", sort=True)):
        g = g.sort_values("tokens")
        fig.add_trace(go.Scatter(x=g["tokens"].clip(lower=1), y=g["value"], mode="lines+markers",
                                 name=f"{task} ({g['metric'].iloc[0].removesuffix('_best')})",
                                 line=dict(color=PALETTE[i % len(PALETTE)])), row=1, col=1)
    wide = pairs.pivot_table(index=["task_or_score", "tokens"], columns="metric", values="value").reset_index()
    for i, (task, g) in enumerate(wide.groupby("task_or_score", sort=True)):
        g, color = g.sort_values("tokens"), PALETTE[i % len(PALETTE)]
        name = task.removeprefix("pairs:")
        fig.add_trace(go.Scatter(x=g["tokens"].clip(lower=1), y=g["accuracy"], mode="lines+markers", name=name,
                                 legendgroup=name, line=dict(color=color),
                                 error_y=dict(type="data", array=(g["accuracy_high"] - g["accuracy"]).clip(lower=0),
                                              arrayminus=(g["accuracy"] - g["accuracy_low"]).clip(lower=0),
                                              thickness=1)), row=1, col=2)
        if "floor:bigram" in g:
            fig.add_trace(go.Scatter(x=g["tokens"].clip(lower=1), y=g["floor:bigram"], mode="lines",
                                     name=f"{name}: bigram floor", legendgroup=name, showlegend=False,
                                     line=dict(color=color, dash="dot", width=1)), row=1, col=2)
    fig.add_hline(y=0.5, line=dict(color=FLOOR_STYLE["chance"][0], dash="dash", width=1), row=1, col=2)
    fig.update_xaxes(type="log", title_text="tokens seen")
    fig.update_yaxes(range=[-0.05, 1.05])
    return fig.update_layout(title=f"{model}: probes and behaviour over pretraining", height=480)
