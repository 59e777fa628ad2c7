"""Objectives: systems that differ only in their pretraining objective, each with pretraining seeds
(`workbench zoo CONFIG`). Per task the score by layer of every system with its multi-bootstrap band
(Sellam et al. 2022), the summary and the comparisons (a claim only with three seeds a system, an
interval that excludes 0 and Holm's correction; the seed pairs that disagree, the contrast and the
compute beside each), share of heads per primary role, and CKA between two systems' layers
beside each system's seed-to-seed CKA (Kornblith et al. 2019)."""

import streamlit as st

from apps import common
from workbench.figures import zoo as Z
from workbench.presentation import views

X_OPTIONS = {"layer": "layer", "relative depth (layer / L)": "depth"}


def layers(run: str, task: str) -> None:
    x = common.choose("x axis", X_OPTIONS, "obj_x")
    st.plotly_chart(Z.zoo_layer_figure(common.view("zoo_layer_scores", run, task), task, x,
                                       metric=views.zoo_metric_name(task)), width="stretch")
    summary = common.view("zoo_summary_table", run)
    st.dataframe(summary[summary["task"] == task].round(4), hide_index=True, width="stretch")
    if "random_init" in summary:
        st.caption("best: the layer chosen on held-out items. random_init: the same probe on the untrained "
                   "architecture, its layer chosen the same way; vs_random_init: best minus it on the same items "
                   "(multi-bootstrap 95% interval); above_random_init: the claim after Holm in the floor family.")
    if "e_s" in summary:
        st.caption("E_s (expected layer of the scalar mix) compares layers within a system only: it misleads "
                   "across models whose layer norms differ (Fayyaz et al. 2021).")


def comparisons(run: str, task: str) -> None:
    df = common.view("zoo_comparisons_table", run)
    if df is None:
        common.no_results("zoo_comparisons", "comparison")
        return
    df = df[(df["task"] == task) | (df["task"] == "")]
    flipped = df[df["flips"] > 0]
    if len(flipped):
        st.warning(f"{len(flipped)} of {len(df)} comparisons have seed pairs that order the two systems the other "
                   "way (column disagree).")
    if (df["claim"] == "no claim").all():
        st.caption("No comparison is claimed (column seeds: fewer than 3 seeds a system make no claim).")
    cols = ["statistic", "task", "system_a", "system_b", "delta", "ci_low", "ci_high", "finding", "unadjusted",
            "p_holm", "family", "seeds", "contrast", "architecture_diff", "compute", "disagree", "n_seed_pairs",
            "interval"]
    st.dataframe(df[cols].round(4), hide_index=True, width="stretch")
    st.caption("delta = A - B with its 95% interval. finding: a claim only with 3 seeds a system or more, an "
               "interval that excludes 0 and Holm's p_holm <= 0.05 in its family (unadjusted: the interval alone); "
               "seeds 'few': 3 or 4, the seed variance under-stated; contrast: objective only, architecture only "
               "or both; compute: 6 N D FLOPs per checkpoint, flagged where they differ by more than 25%.")


def roles(run: str) -> None:
    df = common.view("zoo_role_composition", run)
    if df is None:
        st.caption("No head roles in this zoo (its systems have no attention heads, or `workbench heads` did not run).")
        return
    st.plotly_chart(Z.zoo_roles_figure(df), width="stretch")


def cka(run: str) -> None:
    pairs = common.view("zoo_cka_system_pairs", run)
    if not pairs:
        common.no_results("zoo_cka", "CKA")
        return
    a, b = common.choose("Systems", {f"{a} vs {b}": (a, b) for a, b in pairs}, "obj_cka_pair")
    cross = common.view("zoo_cka_matrix", run, a, b)
    own_a, own_b = common.view("zoo_cka_matrix", run, a, a), common.view("zoo_cka_matrix", run, b, b)
    st.plotly_chart(Z.zoo_cka_figure(cross, a, b, own_a, own_b), width="stretch")


def main() -> None:
    st.title("Objectives")
    run = common.current_run()
    if run is None:
        return
    tasks = common.view("zoo_tasks", run)
    if not tasks:
        common.no_results("zoo_stats", "zoo")
        return
    task = st.selectbox("Task", tasks, key="obj_task")
    tabs = st.tabs(["Layers", "Comparisons", "Head roles", "CKA"])
    for tab, show in zip(tabs, (lambda: layers(run, task), lambda: comparisons(run, task), lambda: roles(run),
                                lambda: cka(run))):
        with tab:
            show()
    training = common.view("zoo_training_table", run)
    if training is not None:
        with st.expander("What each checkpoint got from the same budget"):
            st.dataframe(training, hide_index=True, width="stretch")


main()
