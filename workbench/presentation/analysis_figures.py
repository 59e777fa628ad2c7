"""The figures an analysis command writes beside its tables: `out_dir/figures/<name>.json` (Plotly
JSON, `plotly.io.from_json` reads it back) and, for emergence, one offline HTML page.

They are drawn from the analysis' returned tables with the same builders (`workbench.figures`) and
the same table shaping (`workbench.presentation.views`) as the report and the app, so a figure looks
the same wherever it is opened. The analyses themselves only compute and write tables.

This module is the dispatcher only: `BUILDERS` holds each figure builder, a function that shapes an
analysis' tables with the views and draws them with the Plotly builders of `workbench.figures` (which
hold every figure; the causal probes' in `workbench.figures.causal`), under the key its analysis record
names (`Analysis.figures`, workbench/analyses/registry.py), as the report's `SECTION_BUILDERS` are
named by `Analysis.sections`. `figure_builders` checks the two against each other: a record naming no
builder here and a builder no record names are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go

from probes.heads import table_weightings, weighting_rows
from workbench import figures as F
from workbench.analyses.registry import ANALYSES, analysis
from workbench.core.io import atomic_write_text
from workbench.core.results import write_figures
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
            out[f"probing_structural_{m}"] = F.structural_figure(structural, views.STRUCTURAL_METRICS)
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


def amnesic_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """The amnesic-probing figure of an amnesic run (all its models in one)."""
    summary = views.amnesic_summary_frame(tables["amnesic"])
    return {} if summary is None else {"amnesic": F.amnesic_figure(summary)}


def gating_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of a gate run: roles and families against random heads, and each head's LM-loss increase."""
    summary = views.gating_summary_frame(tables["gating"])
    passport = tables.get("head_passport")
    out: dict[str, go.Figure] = {}
    for m in _models(tables["gating"]):
        if summary is not None and (summary["model"] == m).any():
            out[f"gating_units_{m}"] = F.gating_figure(summary, m)
        grid = None if passport is None else views.passport_grid(passport, m)
        if grid is not None:
            out[f"gating_heads_{m}"] = F.passport_figure(grid)
    return out


def flow_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of a flow run: the token-identity curves, the lens curves and the attribution methods'
    faithfulness, each beside its floor (workbench.figures.flow); a model without lens or attribution
    rows (docs/flow.md, "Which families get what") has no figure of them."""
    out: dict[str, go.Figure] = {}
    has = lambda name, m: name in tables and (tables[name]["model"] == m).any()  # noqa: E731
    for m in _models(tables["flow_mi"]):
        out[f"flow_mi_{m}"] = F.flow_mi_figure(tables["flow_mi"], m)
        if has("flow_lens", m):
            out[f"flow_lens_{m}"] = F.flow_lens_figure(tables["flow_lens"], m)
        if has("flow_attribution", m):
            out[f"flow_attribution_{m}"] = F.flow_attribution_figure(tables["flow_attribution"], m)
    return out


def interventions_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """Per model of an interventions run: the swap-number NIE per layer and site, per head and per (site,
    position), with intervals, beside the random-init model and the same-number control
    (workbench.figures.interventions)."""
    t = tables["interventions"]
    out: dict[str, go.Figure] = {}
    for m in _models(t):
        out[f"interventions_layers_{m}"] = F.interventions_layers_figure(t, m)
        if (t[t["model"] == m]["head"] >= 0).any():
            out[f"interventions_heads_{m}"] = F.interventions_heads_figure(t, m)
        if (t[t["model"] == m]["position"] != "all").any():
            out[f"interventions_positions_{m}"] = F.interventions_positions_figure(t, m)
    return out


@dataclass(frozen=True)
class FigureBuilder:
    """The figures of one analysis: `draw(tables) -> {figure name: Figure}` and how they are written,
    each as Plotly JSON `figures/<figure name>.json` or, with `page`, as a standalone offline HTML page
    `<figure name>.html` (plotly.js inside, no CDN) beside the tables. Called, it draws."""

    draw: Callable[[Mapping[str, pd.DataFrame]], dict[str, go.Figure]]
    page: bool = False

    def __call__(self, tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
        return self.draw(tables)


def emergence_figures(tables: Mapping[str, pd.DataFrame]) -> dict[str, go.Figure]:
    """The emergence curves of a pretraining run's checkpoints, one page."""
    return {"emergence": F.emergence_figure(tables["emergence"])}


# builder key (named by an analysis record's `figures`, workbench/analyses/registry.py) -> its builder
BUILDERS: dict[str, FigureBuilder] = {
    "probing": FigureBuilder(probing_figures),
    "heads": FigureBuilder(heads_figures),
    "amnesic": FigureBuilder(amnesic_figures),
    "gating": FigureBuilder(gating_figures),
    "flow": FigureBuilder(flow_figures),
    "interventions": FigureBuilder(interventions_figures),
    "emergence": FigureBuilder(emergence_figures, page=True),
}


def figure_builders() -> dict[str, FigureBuilder]:
    """Each analysis record's figure builder, by record name (records with `figures` None have none).
    A record naming a key not in `BUILDERS` and a builder no record names are one ValueError naming
    them (a figure is never dropped in silence, nor a builder left unused)."""
    named = {a.name: a.figures for a in ANALYSES.values() if a.figures is not None}
    unknown = sorted(f"{name}: {key}" for name, key in named.items() if key not in BUILDERS)
    unnamed = sorted(k for k in BUILDERS if k not in named.values())
    if unknown or unnamed:
        raise ValueError(f"figure builders: unknown {unknown}, named by no analysis record {unnamed} "
                         "(workbench/analyses/registry.py, Analysis.figures)")
    return {name: BUILDERS[key] for name, key in named.items()}


def write_analysis_figures(kind: str, tables: Mapping[str, pd.DataFrame], out_dir: str | Path) -> list[Path]:
    """Write the figures of analysis `kind` (a record name of workbench.analyses.registry; an unknown
    one is a ValueError) into `out_dir` with the builder its record names (`figure_builders`): Plotly
    JSON under out_dir/figures/, or a page's figures as out_dir/<figure name>.html; an analysis whose
    record names no builder has no figures ([])."""
    builder = figure_builders().get(analysis(kind).name)
    if builder is None:
        return []
    out_dir = Path(out_dir)
    figures = builder(tables)
    if not builder.page:
        return write_figures(out_dir / "figures", figures)
    return [atomic_write_text(out_dir / f"{name}.html", fig.to_html(include_plotlyjs=True, full_html=True))
            for name, fig in figures.items()]
