"""Runs and models: what has been trained or imported, training curves, model cards."""

import streamlit as st

from apps import common
from workbench import figures as F
from workbench.core import results
from workbench.presentation import views


def main() -> None:
    st.title("Runs and models")
    overview = views.runs_overview(common.results_root())
    if len(overview):
        st.dataframe(overview, hide_index=True, width="stretch")
    run = common.current_run()
    if run is None:
        return
    st.subheader("Models")
    cards = common.view("model_cards", run)
    if len(cards):
        st.dataframe(cards, hide_index=True, width="stretch")
        for _, card in cards.iterrows():
            with st.expander(f"Model card: {card['name']}"):
                st.json({k: v for k, v in card.items() if v is not None and v == v})
    else:
        common.no_results("models", "checkpoint")
    st.subheader("Training")
    curves = common.view("training_curves", run)
    if curves is None:
        common.no_results("training")
    else:
        st.plotly_chart(F.training_figure(curves), width="stretch")
    with st.expander("run.json"):
        st.json(results.run_info(run))


main()
