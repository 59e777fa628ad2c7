"""Pruning: pruning curves per method (Michel et al. 2019), the importance grid, speed and size of
the pruned models."""

import streamlit as st

from apps import common
from workbench import figures as F


def main() -> None:
    st.title("Pruning")
    run = common.current_run()
    if run is None:
        return
    curves = common.view("pruning_curves", run)
    if curves is None:
        common.no_results("pruning")
    else:
        metric = st.selectbox("Metric", sorted(curves["metric"].unique()), key="pruning_metric")
        st.plotly_chart(F.pruning_curves_figure(curves[curves["metric"] == metric]), width="stretch")
    imp = common.view("table", run, "importance")
    if imp is None:
        common.no_results("importance")
    else:
        c1, c2 = st.columns(2)
        model = c1.selectbox("Model", sorted(imp["model"].unique()), key="pruning_model")
        method = c2.selectbox("Importance method", sorted(imp[imp["model"] == model]["method"].unique()),
                              key="pruning_method")
        grid = common.view("importance_grid", run, model, method)
        if grid is not None:
            st.plotly_chart(F.head_grid_figure(grid, f"{model}: head importance ({method})", "Reds"),
                            width="stretch")
    kendall = common.view("table", run, "kendall")
    if kendall is not None:
        st.caption("Rank agreement between importance methods (Kendall's tau)")
        st.dataframe(kendall, hide_index=True)
    speed = common.view("table", run, "pruned_speed")
    if speed is None:
        common.no_results("pruned_speed", "speed/size")
    else:
        st.plotly_chart(F.speed_figure(speed), width="stretch")
        st.dataframe(speed, hide_index=True, width="stretch")


main()
