"""Figures of the flow suite (docs/flow.md): Voita et al.'s (2019) token-identity curves, the logit and
tuned lens per layer (nostalgebraist 2020; Belrose et al. 2023), the attribution methods' faithfulness
(Abnar & Zuidema 2020; Sundararajan et al. 2017), each beside its floor, and one typed sentence's lens
and attributions side by side. Built from the `flow_mi`, `flow_lens` and `flow_attribution` tables and
from `workbench.analyses.flow.flow_sentence`'s frames; a zoo's curves per system from its `zoo_stats`
(task "flow", `workbench.analyses.zoo.flow_statistics`)."""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.layers import PALETTE

# (variant, control) -> (legend words, line dash): the trained model and its two floors
MI_LINES = {("trained", "none"): ("trained", "solid"), ("random_init", "none"): ("random init (floor)", "dash"),
            ("trained", "shuffled"): ("shuffled tokens (floor)", "dot")}
LENS_METRICS = {"kl": "KL(final || lens), nats", "top1_agree": "top-1 agreement with the final layer",
                "lm_loss": "LM loss through the lens, nats"}


def _band(g: pd.DataFrame) -> dict:
    return dict(type="data", array=(g["ci_high"] - g["value"]).clip(lower=0),
                arrayminus=(g["value"] - g["ci_low"]).clip(lower=0))


def flow_mi_figure(mi: pd.DataFrame, model: str, metric: str = "mi_bits") -> go.Figure:
    """Per layer, the MI of the representation with the input token and with the token to predict
    (one panel each), per estimator: the trained model (95% interval over sentences) beside the
    random-init model and the shuffled-token control."""
    d = mi[(mi["model"] == model) & (mi["metric"] == metric)]
    labels = [x for x in ("input", "predict") if x in set(d["label"])]
    fig = make_subplots(rows=1, cols=max(len(labels), 1), subplot_titles=[
        {"input": "the input token", "predict": "the token to predict"}[x] for x in labels])
    for c, label in enumerate(labels, start=1):
        for e, est in enumerate(sorted(d["estimator"].unique())):
            for (variant, control), (words, dash) in MI_LINES.items():
                g = d[(d["label"] == label) & (d["estimator"] == est) & (d["variant"] == variant)
                      & (d["control"] == control)].sort_values("layer")
                if g.empty:
                    continue
                fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], error_y=_band(g), mode="lines+markers",
                                         name=f"{est}: {words}", legendgroup=f"{est}{variant}{control}",
                                         showlegend=c == 1, line=dict(color=PALETTE[e], dash=dash)), 1, c)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=c)
    fig.update_yaxes(title_text={"mi_bits": "I(layer; token), bits", "mi_fraction": "I / H(token)"}.get(metric, metric),
                     row=1, col=1)
    return fig.update_layout(title=f"{model}: token identity and the token to predict per layer (Voita et al. 2019)",
                             height=420)


def flow_lens_figure(lens: pd.DataFrame, model: str) -> go.Figure:
    """Per layer, the logit and tuned lens' KL to the final distribution, top-1 agreement and LM loss
    (95% intervals over sentences), beside the random-init model's logit lens."""
    d = lens[lens["model"] == model]
    metrics = [m for m in LENS_METRICS if m in set(d["metric"])]
    fig = make_subplots(rows=1, cols=max(len(metrics), 1), subplot_titles=[LENS_METRICS[m] for m in metrics])
    lines = [("trained", "logit", "logit lens", PALETTE[0], "solid"), ("trained", "tuned", "tuned lens", PALETTE[1], "solid"),
             ("random_init", "logit", "random init, logit lens (floor)", PALETTE[7], "dash")]
    for c, metric in enumerate(metrics, start=1):
        for variant, name, words, color, dash in lines:
            g = d[(d["metric"] == metric) & (d["variant"] == variant) & (d["lens"] == name)].sort_values("layer")
            if g.empty:
                continue
            fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], error_y=_band(g), mode="lines+markers", name=words,
                                     legendgroup=words, showlegend=c == 1, line=dict(color=color, dash=dash)), 1, c)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=c)
    return fig.update_layout(title=f"{model}: what each layer would predict (logit and tuned lens)", height=420)


TARGET_WORDS = {"lm": "the LM's log-prob of its token"}  # flow_attribution's target -> words; else a classifier's task


def flow_attribution_figure(attr: pd.DataFrame, model: str) -> go.Figure:
    """Each attribution method's faithfulness, Spearman with leave-one-out, deletion AOPC and insertion
    AOPC (95% intervals over sentences), the random attribution (the floor) in grey; the title names the
    attributed prediction (target "lm": the LM's, else the classifier's task)."""
    d = attr[attr["model"] == model]
    panels = [("spearman_loo", "Spearman with leave-one-out"), ("aopc", "AOPC of the deletion curve"),
              ("aopc_insertion", "AOPC of the insertion curve")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in panels])
    for c, (metric, _) in enumerate(panels, start=1):
        g = d[d["metric"] == metric]
        colors = [PALETTE[7] if m == "random" else PALETTE[0] for m in g["method"]]
        fig.add_trace(go.Bar(x=g["method"], y=g["value"], error_y=_band(g), marker_color=colors, showlegend=False), 1, c)
    n = int(d["n_items"].max()) if len(d) else 0
    target = ", ".join(TARGET_WORDS.get(t, f"the {t} classifier's predicted class logit") for t in d["target"].unique())
    return fig.update_layout(title=f"{model}: faithfulness of the attribution of {target or 'no prediction'} "
                                   f"({n} sentences; grey: random)", height=420)


def flow_sentence_figure(attributions: pd.DataFrame) -> go.Figure:
    """One sentence's attributions: methods (rows) x input tokens (columns), each method's scores
    scaled by their largest magnitude so the methods share one colour scale."""
    wide = attributions.pivot(index="method", columns="position", values="score")
    tokens = attributions.drop_duplicates("position").set_index("position").loc[wide.columns, "token"]
    scaled = wide.div(wide.abs().max(axis=1).where(lambda s: s > 0, 1.0), axis=0)
    fig = go.Figure(go.Heatmap(z=scaled.to_numpy(), x=[f"{p}:{t}" for p, t in zip(wide.columns, tokens)],
                               y=list(wide.index), colorscale="RdBu_r", zmid=0, zmin=-1, zmax=1,
                               customdata=wide.to_numpy(), hovertemplate="%{y} %{x}: %{customdata:.4f}<extra></extra>"))
    return fig.update_layout(title="Attribution of the prediction to each input token (scaled per method)",
                             height=120 + 40 * len(wide))


# the zoo's flow curves (zoo_stats statistics of task "flow"), one panel each: statistic -> panel title
ZOO_CURVES = {"flow_mi_input_kmeans": "input token, k-means: I / H",
              "flow_mi_input_probe": "input token, probe: I / H",
              "flow_lens_kl_tuned": "tuned lens: KL(final || layer), nats",
              "flow_lens_kl_logit": "logit lens: KL(final || layer), nats"}
ZOO_FLOORS = {"_random_init": ("random init (floor)", "dash"), "_shuffled": ("shuffled tokens (floor)", "dot")}


def zoo_flow_figure(stats: pd.DataFrame) -> go.Figure:
    """A zoo's flow curves per system (a seq2seq's decoder stack as "<system>;decoder"): per layer the
    seed mean of the input-token MI share (k-means and probe) and of the tuned and logit lens' KL, each
    with its seeds-only 95% interval, the random-init model (and, for the MI, the shuffled-token
    control) dashed beside it in the system's colour; panels without rows are left out."""
    d = stats[(stats["task"] == "flow") & (stats["layer"] >= 0)]
    panels = [k for k in ZOO_CURVES if (d["statistic"] == k).any()]
    fig = make_subplots(rows=1, cols=max(len(panels), 1), subplot_titles=[ZOO_CURVES[k] for k in panels])
    systems = list(dict.fromkeys(d["system"]))
    for c, stat in enumerate(panels, start=1):
        floors = {"_random_init": f"{stat}_random_init", "_shuffled": f"{stat}_shuffled"}
        if stat.startswith("flow_lens_"):  # the lens' floor is the random-init model's logit lens
            floors = {"_random_init": stat.rsplit("_", 1)[0] + "_logit_random_init"}
        for i, system in enumerate(systems):
            lines = [(stat, system, "solid")] + [(floors[k], f"{system}: {words}", style)
                                                  for k, (words, style) in ZOO_FLOORS.items() if k in floors]
            for name, words, dash in lines:
                g = d[(d["statistic"] == name) & (d["system"] == system)].sort_values("layer")
                if g.empty:
                    continue
                g = g.assign(ci_low=g["ci_low"].fillna(g["value"]), ci_high=g["ci_high"].fillna(g["value"]))  # one seed
                fig.add_trace(go.Scatter(x=g["layer"], y=g["value"], error_y=_band(g),
                                         mode="lines+markers", name=words, legendgroup=words, showlegend=c == 1,
                                         line=dict(color=PALETTE[i % len(PALETTE)], dash=dash)), 1, c)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=c)
    return fig.update_layout(title="Token identity and the lens per layer, per system (mean over pretraining seeds, "
                                   "95% seeds-only intervals)", height=440)
