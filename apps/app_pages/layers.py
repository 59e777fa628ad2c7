"""Layers: probing score per layer (several models overlaid), mixing weights, expected layer and
center of gravity per task (Tenney et al. 2019, Fig. 1), selectivity and baselines."""

import streamlit as st

from apps import common
from workbench import figures as F


def main() -> None:
    st.title("Layers")
    run = common.current_run()
    if run is None:
        return
    metrics = common.view("probing_metrics", run)
    if not metrics:
        common.no_results("probing")
        return
    metric = st.selectbox("Metric", metrics, key="layers_metric")
    scores = common.view("layer_scores", run, metric)
    if scores is None:
        common.no_results("probing", f"single-layer {metric}")
        return
    c1, c2 = st.columns(2)
    all_models, all_tasks = sorted(scores["model"].unique()), sorted(scores["task"].unique())
    models = c1.multiselect("Models", all_models, default=all_models, key="layers_models")
    tasks = c2.multiselect("Tasks", all_tasks, default=all_tasks, key="layers_tasks")
    shown = scores[scores["model"].isin(models) & scores["task"].isin(tasks)]
    if len(shown):
        st.plotly_chart(F.layer_scores_figure(shown, metric), width="stretch")

    model = st.selectbox("Model for the summary", all_models, key="layers_model")
    summary = common.view("layer_summary", run, metric)
    mix = common.view("mix_weights", run)
    left, right = st.columns(2)
    if mix is None:
        with left:
            common.no_results("mix_weights", "scalar-mix")
    else:
        mine = mix[mix["model"] == model]
        s = summary[summary["model"] == model] if summary is not None else summary
        left.plotly_chart(F.pipeline_figure(mine, s), width="stretch")
        right.plotly_chart(F.mix_weights_figure(mine), width="stretch")
    if summary is not None:
        st.plotly_chart(F.summary_figure(summary, model), width="stretch")
        st.dataframe(summary[summary["model"] == model].round(3), hide_index=True, width="stretch")


main()
