"""Causal probes: does the model use what the probes find? Amnesic probing (Elazar et al. 2021:
erase a property, against erasing as many random directions), head gating (a head role's effect
against random heads of the same number) and its per-head passport, and the structural probes
(Hewitt and Manning 2019: UUAS and root accuracy per layer, each best layer beside its four floors)."""

import streamlit as st

from apps import common
from workbench import figures as F
from workbench.presentation import views


def amnesic(run: str) -> None:
    df = common.view("amnesic_summary", run)
    if df is None:
        common.no_results("amnesic", "amnesic-probing")
        return
    st.plotly_chart(F.amnesic_figure(df), width="stretch")
    st.caption("gap = LM-loss increase of the eraser minus that of a random eraser of the same rank; "
               "probe_acc: a probe trained and tested on the erased vectors (intact: before erasure)")
    st.dataframe(df.round(4), hide_index=True, width="stretch")


def gating(run: str) -> None:
    df = common.view("gating_summary", run)
    if df is None:
        if common.view("table", run, "gating") is None:
            common.no_results("gating", "head-gating")
        else:
            st.info("This run's gating gated single heads only: role and family units need a heads_classes table "
                    f"(run `{views.missing_command('heads_classes')}` into the run, then gate again).")
        return
    model = st.selectbox("Model", sorted(df["model"].unique()), key="causal_gate_model")
    st.plotly_chart(F.gating_figure(df, model), width="stretch")
    st.dataframe(df[df["model"] == model].round(4), hide_index=True, width="stretch")


def passport(run: str) -> None:
    df = common.view("head_passport", run)
    if df is None:
        common.no_results("head_passport", "head-passport")
        return
    c1, c2 = st.columns(2)
    model = c1.selectbox("Model", sorted(df["model"].unique()), key="causal_passport_model")
    numeric = [c for c in df.columns if c not in ("model", "layer", "head") and not c.endswith("_layer")
               and df[c].dtype.kind in "fi"]
    column = c2.selectbox("Colour by", numeric, key="causal_passport_column")
    grid = views.passport_grid(df, model, column)
    if grid is not None:
        st.plotly_chart(F.passport_figure(grid, column), width="stretch")
    st.dataframe(df[df["model"] == model].round(4), hide_index=True, width="stretch")


def structural(run: str) -> None:
    df = common.view("structural_summary", run)
    if df is None:
        common.no_results("structural", "structural-probe")
        return
    st.plotly_chart(F.structural_figure(df, views.STRUCTURAL_METRICS), width="stretch")
    floors = common.view("structural_floors", run)
    if floors is None:
        st.info("This run's probing table has no structural floors (written before them): the scores stand alone.")
    else:
        metrics = [m for m in views.probing_metrics(run) if m in set(floors["metric"])]
        metric = st.selectbox("Metric beside its floors", metrics, key="causal_floor_metric")
        st.plotly_chart(F.structural_floors_figure(floors, metric), width="stretch")
        st.caption("best layer of each model beside a random tree, the adjacent chain, a probe on position alone "
                   "and the untrained model's best layer (95% intervals); above = 1: the model's interval lies "
                   "above the floor's")
        st.dataframe(floors[floors["metric"] == metric].round(4), hide_index=True, width="stretch")
    st.dataframe(df.round(4), hide_index=True, width="stretch")


def main() -> None:
    st.title("Causal probes")
    run = common.current_run()
    if run is None:
        return
    tabs = st.tabs(["Amnesic", "Head gating", "Passport", "Structural"])
    for tab, show in zip(tabs, (amnesic, gating, passport, structural)):
        with tab:
            show(run)


main()
