"""Figures of the agreement mediation analysis (docs/interventions.md; Vig et al. 2020, Finlayson et al.
2021): the natural indirect effect of swapping the subject's number per layer and site, per head, and
per (site, position) for the heads and sub-layers patched at one token position alone (Meng et al.
2022's causal tracing grid), with 95% intervals over items, beside its two floors: the same run on the
random-init model and the same-number control intervention. Built from the `interventions` table of
`workbench.analyses.interventions`."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.layers import PALETTE

# (variant, intervention) -> (legend words, colour, line dash): the experiment and its two floors
LINES = {("trained", "swap_number"): ("trained, swap number", PALETTE[0], "solid"),
         ("random_init", "swap_number"): ("random init, swap number (floor)", PALETTE[7], "dash"),
         ("trained", "same_number"): ("trained, same-number control (floor)", PALETTE[1], "dot")}
# (site_kind, position) -> panel title: the per-layer sites, in forward order of a block
LAYER_PANELS = {("resid_post", "subject"): "residual stream at the subject", ("attn_out", "all"): "attention output",
                ("mlp_out", "all"): "MLP output", ("resid_post", "reading"): "residual stream at the reading position"}
METRICS = {"nie_log": "NIE, nats of log-probability difference", "nie_ratio": "NIE (ratio, Finlayson et al.)",
           "nde_log": "NDE, nats of log-probability difference", "restored": "restored share (denoising)",
           "iia": "interchange intervention accuracy"}
# the run-level metric drawn as a reference line beside each site metric: the total effect it splits
TOTAL = {"nie_log": "te_log", "nie_ratio": "te_ratio", "nde_log": "te_log", "iia": "iia_ceiling"}


def _band(g: pd.DataFrame) -> dict:
    return dict(type="data", array=(g["ci_high"] - g["value"]).clip(lower=0),
                arrayminus=(g["value"] - g["ci_low"]).clip(lower=0))


def _total(d: pd.DataFrame, metric: str) -> pd.Series | None:
    """The trained model's swap-number total effect (or IIA ceiling) row, None when absent."""
    t = d[(d["site"] == "input") & (d["metric"] == TOTAL.get(metric, "")) & (d["variant"] == "trained")
          & (d["intervention"] == "swap_number")]
    return t.iloc[0] if len(t) else None


def _title(d: pd.DataFrame, model: str, what: str, metric: str) -> str:
    n = d[(d["variant"] == "trained") & (d["intervention"] == "swap_number")]["n_items"]
    t = _total(d, metric)
    te = "" if t is None else f"; {TOTAL[metric]} {t.value:.3f} [{t.ci_low:.3f}, {t.ci_high:.3f}]"
    return f"{model}: {what} of the subject's number ({int(n.max()) if len(n) else 0} items{te})"


def interventions_layers_figure(table: pd.DataFrame, model: str, metric: str = "nie_log") -> go.Figure:
    """Per layer, one panel per site (the residual stream at the subject and at the reading position,
    the attention and MLP outputs): `metric` of the swap-number intervention on the trained model (95%
    interval over items) beside the random-init model and the same-number control; the trained model's
    total effect as a horizontal line."""
    d = table[(table["model"] == model) & (table["metric"] == metric) & (table["head"] == -1)]
    panels = [k for k in LAYER_PANELS if ((d["site_kind"] == k[0]) & (d["position"] == k[1])).any()]
    fig = make_subplots(rows=1, cols=max(len(panels), 1), shared_yaxes=True,
                        subplot_titles=[LAYER_PANELS[k] for k in panels])
    total = _total(table[table["model"] == model], metric)
    for c, (kind, position) in enumerate(panels, start=1):
        for (variant, intervention), (words, color, dash) in LINES.items():
            g = d[(d["site_kind"] == kind) & (d["position"] == position) & (d["variant"] == variant)
                  & (d["intervention"] == intervention)].sort_values("layer")
            if g.empty:
                continue
            fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], error_y=_band(g), mode="lines+markers", name=words,
                                     legendgroup=words, showlegend=c == 1, line=dict(color=color, dash=dash)), 1, c)
        if total is not None:
            fig.add_hline(y=total.value, line=dict(color=PALETTE[3], dash="longdash", width=1), row=1, col=c,
                          annotation_text=f"{TOTAL[metric]} (trained)" if c == 1 else None)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=c)
    fig.update_yaxes(title_text=METRICS.get(metric, metric), row=1, col=1)
    return fig.update_layout(title=_title(table[table["model"] == model], model, f"{metric} per layer", metric),
                             height=420)


def interventions_heads_figure(table: pd.DataFrame, model: str, metric: str = "nie_log") -> go.Figure:
    """Per head (x: layer.head in forward order), `metric` of the swap-number intervention on the trained
    model with its 95% interval beside the random-init model and the same-number control."""
    d = table[(table["model"] == model) & (table["metric"] == metric) & (table["head"] >= 0)
              & (table["position"] == "all")]
    fig = go.Figure()
    order = d[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"])
    labels = [f"L{l}.H{h}" for l, h in zip(order["layer"], order["head"])]
    for k, ((variant, intervention), (words, color, _)) in enumerate(LINES.items()):
        g = d[(d["variant"] == variant) & (d["intervention"] == intervention)].sort_values(["layer", "head"])
        if g.empty:
            continue
        fig.add_trace(go.Scatter(x=[f"L{l}.H{h}" for l, h in zip(g["layer"], g["head"])], y=g["value"],
                                 error_y=_band(g), mode="markers", name=words, marker=dict(color=color, size=8),
                                 offsetgroup=str(k)))
    fig.add_hline(y=0, line=dict(color="#bbbbbb", width=1))
    fig.update_xaxes(title_text="head (layer.head)", categoryorder="array", categoryarray=labels)
    fig.update_yaxes(title_text=METRICS.get(metric, metric))
    return fig.update_layout(title=_title(table[table["model"] == model], model, f"{metric} per head", metric),
                             height=420, scattermode="group")


# sub-layer kinds in a block's forward order: the rows of the position grid, each layer's heads after its attn_out
_ROW_ORDER = {"attn_out": 0, "head_out": 1, "mlp_out": 2, "resid_post": 3}


def _grid_label(kind: str, layer: int, head: int) -> str:
    return f"L{layer}.H{head}" if head >= 0 else f"L{layer} {kind}"


def interventions_positions_figure(table: pd.DataFrame, model: str, metric: str = "nie_log") -> go.Figure:
    """The per-position grid: one heatmap per run (the trained model's swap number, then its two floors),
    rows the heads and sub-layer outputs in forward order, columns the positions they were patched at
    ("all", then each per-item position: the subject's last token, the reading position); a cell's
    hover gives its 95% interval over items. One colour scale for the three panels, centred at zero."""
    d = table[(table["model"] == model) & (table["metric"] == metric) & (table["site"] != "input")
              & table["site_kind"].isin(list(_ROW_ORDER))]
    positions = ["all"] + sorted(p for p in d["position"].unique() if p != "all")
    rows = (d[["layer", "site_kind", "head"]].drop_duplicates()
            .assign(o=lambda x: x["site_kind"].map(_ROW_ORDER)).sort_values(["layer", "o", "head"]))
    labels = [_grid_label(k, l, h) for l, k, h in zip(rows["layer"], rows["site_kind"], rows["head"])]
    runs = [k for k in LINES if ((d["variant"] == k[0]) & (d["intervention"] == k[1])).any()]
    fig = make_subplots(rows=1, cols=max(len(runs), 1), shared_yaxes=True, subplot_titles=[LINES[k][0] for k in runs])
    vmax = float(d["value"].abs().max()) if len(d) else 1.0
    for c, (variant, intervention) in enumerate(runs, start=1):
        g = d[(d["variant"] == variant) & (d["intervention"] == intervention)]
        g = g.assign(label=[_grid_label(k, l, h) for l, k, h in zip(g["layer"], g["site_kind"], g["head"])])
        z = g.pivot_table(index="label", columns="position", values="value", aggfunc="first").reindex(
            index=labels, columns=positions)
        lo = g.pivot_table(index="label", columns="position", values="ci_low", aggfunc="first").reindex(
            index=labels, columns=positions)
        hi = g.pivot_table(index="label", columns="position", values="ci_high", aggfunc="first").reindex(
            index=labels, columns=positions)
        text = [[f"{v:.4f} [{a:.4f}, {b:.4f}]" for v, a, b in zip(zr, lr, hr)]
                for zr, lr, hr in zip(z.values, lo.values, hi.values)]
        fig.add_trace(go.Heatmap(z=z.values, x=positions, y=labels, text=text, hovertemplate="%{y} @ %{x}: %{text}",
                                 zmin=-vmax, zmax=vmax, zmid=0, colorscale="RdBu_r", showscale=c == 1,
                                 colorbar=dict(title=METRICS.get(metric, metric))), 1, c)
        fig.update_xaxes(title_text="patched at", row=1, col=c)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    return fig.update_layout(title=_title(table[table["model"] == model], model, f"{metric} per site and position",
                                          metric), height=max(380, 22 * len(labels) + 160))


# item_effect's log-probability differences, in the order of the figure: the two plain runs, then the two patched
ITEM_BARS = {"d_clean": "clean u", "d_intervened": "intervened u'", "d_noised": "u, site from u' (noising)",
             "d_denoised": "u', site from u (denoising)"}


def item_effect_figure(effect: pd.DataFrame, site: str) -> go.Figure:
    """One item and one site (`workbench.analyses.interventions.item_effect`): the log-probability
    difference d = log p(agreeing verb) - log p(other form), each form by all its subwords, of the clean, intervened, noising and denoising runs;
    the NIE is how far the noising bar moves from the clean one, the NDE how far the denoising bar does."""
    v = effect.set_index("quantity")["value"]
    colors = [PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[4]]
    fig = go.Figure(go.Bar(x=list(ITEM_BARS.values()), y=[v[k] for k in ITEM_BARS], marker_color=colors,
                           text=[f"{v[k]:.4f}" for k in ITEM_BARS], textposition="outside"))
    fig.add_hline(y=0, line=dict(color="#bbbbbb", width=1))
    fig.update_yaxes(title_text="d = log p(agreeing) - log p(other), nats")
    return fig.update_layout(title=f"{site}: NIE (log) {v['nie_log']:.4f}, NDE (log) {v['nde_log']:.4f}, "
                                   f"TE (log) {v['te_log']:.4f}", height=380)
