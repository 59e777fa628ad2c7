"""Finetuned vs frozen: the frozen-vs-finetuned table, CKA per layer and as a matrix (Kornblith et
al. 2019), probing deltas, and how much each head's attention changed."""

import streamlit as st

from apps import common
from workbench import figures as F


def main() -> None:
    st.title("Finetuned vs frozen")
    run = common.current_run()
    if run is None:
        return
    fvf = common.view("frozen_vs_finetuned", run)
    if fvf is None:
        common.no_results("frozen_vs_finetuned")
    else:
        st.plotly_chart(F.fvf_figure(fvf), width="stretch")
        wide = fvf.pivot_table(index=["model", "task", "metric"], columns="setting", values="value").reset_index()
        st.dataframe(wide.round(4), hide_index=True, width="stretch")
    pairs = common.view("cka_pairs", run)
    if not pairs:
        common.no_results("cka", "CKA")
        return
    a, b, kind = common.choose("Comparison", {f"{a} vs {b} ({k})": (a, b, k) for a, b, k in pairs}, "compare_pair")
    m = common.view("cka_matrix", run, a, b, kind)
    left, right = st.columns(2)
    left.plotly_chart(F.cka_diagonal_figure(m, a, b), width="stretch")
    right.plotly_chart(F.cka_heatmap(m, a, b, kind), width="stretch")
    deltas = common.view("probing_deltas", run, a, b)
    if deltas is None:
        common.no_results("probing_change", f"probing change from {a} to {b}")
    else:
        st.plotly_chart(F.probing_delta_figure(deltas, a, b), width="stretch")
    change = common.view("head_change_grid", run, a, b)
    if change is None:
        common.no_results("head_change", "head-change")
    else:
        st.plotly_chart(F.head_grid_figure(change, f"Head change {a} -> {b} ({change.score})", "Oranges"),
                        width="stretch")


main()
