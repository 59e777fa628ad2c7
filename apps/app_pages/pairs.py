"""Minimal pairs: does the model prefer the grammatical sentence (Marvin & Linzen 2018; Warstadt et al.
2020, BLiMP)? Accuracy per suite and phenomenon with its interval beside the chance, frequency, bigram
and random-init floors on the same items, accuracy against the number of attractors (Linzen et al.
2016), the probes and the accuracy over the pretraining checkpoints (Zhang et al. 2021; `emergence` with
`pairs`), and the competence line: how far each model got at all (docs/behaviour.md)."""

import streamlit as st

from apps import common
from workbench import figures as F
from workbench.presentation import views


def main() -> None:
    st.title("Minimal pairs")
    run = common.current_run()
    if run is None:
        return
    line = views.competence_text(common.view("competence", run))
    if line:
        st.caption(line[0].upper() + line[1:] + ".")
    summary = common.view("pairs_summary", run)
    if summary is None:
        common.no_results("minimal_pairs", "minimal-pair")
        return
    c1, c2 = st.columns(2)
    model = c1.selectbox("Model", sorted(summary["model"].unique()), key="pairs_model")
    acc = common.view("pairs_accuracy", run)
    variants = ["each"] + sorted(acc.loc[acc["model"] == model, "variant"].unique())
    variant = c2.selectbox("Variant", variants, key="pairs_variant")
    st.plotly_chart(F.pairs_figure(acc, model, None if variant == "each" else variant), width="stretch")
    attr = common.view("pairs_attractors", run)
    if attr is not None and (attr["model"] == model).any():
        st.plotly_chart(F.attractors_figure(attr, model), width="stretch")
    em = common.view("table", run, "emergence")
    if em is not None and ((em["model"] == model) & em["task_or_score"].str.startswith("pairs:")).any():
        st.plotly_chart(F.probe_behaviour_figure(em, model), width="stretch")
    mine = summary[summary["model"] == model]
    if variant != "each":
        mine = mine[mine["variant"] == variant]
    st.caption("above: the floors the model's 95% interval lies above (chance: above a fair coin's 95% range; "
               "frequency, bigram, random_init: above their accuracy on the same items)")
    st.dataframe(mine.drop(columns=["above_all"]).round(3), hide_index=True, width="stretch")


main()
