"""The figures an analysis command writes beside its tables: `out_dir/figures/<name>.json` (Plotly
JSON, `plotly.io.from_json` reads it back) and, for emergence, one offline HTML page.

They are drawn from the analysis' returned tables with the same builders (`workbench.figures`) and
the same table shaping (`workbench.presentation.views`) as the report and the app, so a figure looks
the same wherever it is opened. The analyses themselves only compute and write tables.

The causal probes' figures are built here too, from the views' summaries: structural probes (Hewitt
and Manning 2019: UUAS and root accuracy per layer), amnesic probing (Elazar et al. 2021: the LM-loss
increase of an eraser against its random control) and head gating (a role's LM-loss increase against
random heads of the same number; each head's increase as a layer x head grid).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probes.heads import table_weightings, weighting_rows
from workbench import figures as F
from workbench.core.io import atomic_write_text
from workbench.core.results import write_figures
from workbench.figures.layers import PALETTE
from workbench.presentation import views


def _models(df: pd.DataFrame | None) -> list[str]:
    return [] if df is None or not len(df) else sorted(df["model"].unique())


def _main_metric(probing: pd.DataFrame) -> str:
    metrics = set(probing["metric"])
    return "accuracy" if "accuracy" in metrics else sorted(metrics)[0]


def probing_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of a probe run: score per layer, cumulative gains, scalar-mix weights and the
    expected-layer "pipeline" (Tenney et al. 2019b, Fig. 1); the structural probes (their own metrics)
    in a figure of their own."""
    probing, mix, summary = tables["probing"], tables.get("mix_weights"), tables.get("probing_summary")
    out: dict[str, go.Figure] = {}
    for m in _models(probing):
        p = probing[probing["model"] == m]
        structural = views.structural_summary_frame(p)
        if structural is not None:
            out[f"probing_structural_{m}"] = structural_figure(structural)
        p = p[~p["task"].isin(list(views.STRUCTURAL_METRICS))]
        if not len(p):
            continue
        metric = _main_metric(p)
        scores = views.layer_scores_frame(p, metric)
        if scores is not None:
            out[f"probing_layers_{m}"] = F.layer_scores_figure(scores, metric)
        if (p["mode"] == "cumulative").any():
            out[f"probing_cumulative_{m}"] = F.cumulative_figure(p)
        pm = None if mix is None else mix[mix["model"] == m]
        if pm is not None and len(pm):
            pm = views.mix_weights_frame(pm)
            out[f"probing_mix_{m}"] = F.mix_weights_figure(pm)
            ps = None if summary is None else summary[summary["model"] == m]
            out[f"probing_summary_{m}"] = F.pipeline_figure(pm, views.layer_summary_frame(p, ps, metric))
    return out


def heads_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of a heads run: the primary role of every head, the best head per relation against
    the offset baseline, the 2-D map of heads, and the share of each head's argmax on the previous word.
    Drawn from the raw-attention rows; a run with norm-weighted attention (Kobayashi et al. 2020,
    `weightings`) gets the same figures of those rows too, named with the suffix `_norm`."""
    heads, classes = tables["heads"], tables.get("heads_classes")
    relations, similarity = tables.get("relations"), tables.get("head_similarity")
    out: dict[str, go.Figure] = {}
    for m in _models(heads):
        for w in table_weightings(heads[heads["model"] == m]):
            suffix, what = ("", "") if w == "raw" else (f"_{w}", f" ({w}-weighted attention)")
            roles = None if classes is None else views.role_grid(classes, m, w)
            if roles is not None:
                out[f"heads_roles_{m}{suffix}"] = F.head_grid_figure(roles, title=f"{m}: primary role of each head{what}")
            rel = None if relations is None else weighting_rows(relations, w)
            rel = None if rel is None else rel[rel["model"] == m].dropna(subset=["test_acc"])
            if rel is not None and len(rel):
                out[f"heads_relations_{m}{suffix}"] = F.relations_figure(rel)
            hmap = None if similarity is None else views.head_map_frame(similarity, classes, m, w)
            if hmap is not None:
                out[f"heads_map_{m}{suffix}"] = F.head_map_figure(hmap)
            prev = views.score_grid(heads, m, "positional_share:-1", w)
            if prev is not None:
                out[f"heads_positional_prev_{m}{suffix}"] = F.head_grid_figure(prev)
    return out


# ------------------------------------------------------------------------------ causal probes
def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def structural_figure(summary: pd.DataFrame) -> go.Figure:
    """Structural probes (Hewitt and Manning 2019) from `views.structural_summary_frame`: a panel per
    task with its headline metric per layer (UUAS for distance, root accuracy for depth; solid, the
    min-max over seeds as error bars) and its Spearman correlation (DSpr, NSpr; dotted), a colour per model."""
    tasks = [t for t in views.STRUCTURAL_METRICS if (summary["task"] == t).any()]
    fig = make_subplots(rows=1, cols=len(tasks), shared_yaxes=True,
                        subplot_titles=[f"{t}: {' / '.join(views.STRUCTURAL_METRICS[t])}" for t in tasks])
    for c, task in enumerate(tasks, start=1):
        for i, model in enumerate(sorted(summary["model"].unique())):
            for metric, dash in zip(views.STRUCTURAL_METRICS[task], (None, "dot")):
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


def passport_figure(passport: pd.DataFrame, model: str, column: str = "lm_loss_delta") -> go.Figure | None:
    """Layer x head grid of one `head_passport` column (default: the LM-loss increase when the head
    alone is gated), on a diverging scale centred at 0; None when the column has no value for `model`."""
    grid = views.passport_grid(passport, model, column)
    if grid is None:
        return None
    return F.head_grid_figure(grid, f"{model}: {column} when the head alone is gated", "RdBu_r").update_traces(zmid=0)


def amnesic_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """The amnesic-probing figure of an amnesic run (all its models in one)."""
    summary = views.amnesic_summary_frame(tables["amnesic"])
    return {} if summary is None else {"amnesic": amnesic_figure(summary)}


def gating_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of a gate run: roles and families against random heads, and each head's LM-loss increase."""
    summary = views.gating_summary_frame(tables["gating"])
    passport = tables.get("head_passport")
    out: dict[str, go.Figure] = {}
    for m in _models(tables["gating"]):
        if summary is not None and (summary["model"] == m).any():
            out[f"gating_units_{m}"] = gating_figure(summary, m)
        heads = None if passport is None else passport_figure(passport, m)
        if heads is not None:
            out[f"gating_heads_{m}"] = heads
    return out


def flow_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of a flow run: the token-identity curves, the lens curves and the attribution methods'
    faithfulness, each beside its floor (workbench.figures.flow)."""
    out: dict[str, go.Figure] = {}
    for m in _models(tables["flow_mi"]):
        out[f"flow_mi_{m}"] = F.flow_mi_figure(tables["flow_mi"], m)
        if "flow_lens" in tables:
            out[f"flow_lens_{m}"] = F.flow_lens_figure(tables["flow_lens"], m)
        if "flow_attribution" in tables:
            out[f"flow_attribution_{m}"] = F.flow_attribution_figure(tables["flow_attribution"], m)
    return out


def interventions_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of an interventions run: the swap-number NIE per layer and site and per head, with
    intervals, beside the random-init model and the same-number control (workbench.figures.interventions)."""
    t = tables["interventions"]
    out: dict[str, go.Figure] = {}
    for m in _models(t):
        out[f"interventions_layers_{m}"] = F.interventions_layers_figure(t, m)
        if (t[t["model"] == m]["head"] >= 0).any():
            out[f"interventions_heads_{m}"] = F.interventions_heads_figure(t, m)
    return out


# analysis name (workbench.analyses.registry.ANALYSES) -> its figures as Plotly JSON under figures/
BUILDERS: dict[str, Callable[[Mapping[str, pd.DataFrame]], dict[str, go.Figure]]] = {
    "probe": probing_figures,
    "heads": heads_figures,
    "amnesic": amnesic_figures,
    "gate": gating_figures,
    "flow": flow_figures,
    "interventions": interventions_figures,
}
# analysis name -> one figure written as a standalone page, out_dir/<name>.html (offline, no CDN)
PAGES: dict[str, Callable[[Mapping[str, pd.DataFrame]], go.Figure]] = {
    "emergence": lambda tables: F.emergence_figure(tables["emergence"]),
}


def write_analysis_figures(kind: str, tables: Mapping[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """Write the figures of analysis `kind` (a record name of workbench.analyses.registry) into `out_dir`:
    its `BUILDERS` figures as Plotly JSON under out_dir/figures/, its `PAGES` figure as out_dir/<kind>.html;
    an analysis in neither has no figures ([])."""
    out_dir = Path(out_dir)
    written = []
    if kind in PAGES:
        html = PAGES[kind](tables).to_html(include_plotlyjs=True, full_html=True)
        written.append(atomic_write_text(out_dir / f"{kind}.html", html))
    if kind in BUILDERS:
        written += write_figures(out_dir / "figures", BUILDERS[kind](tables))
    return written
