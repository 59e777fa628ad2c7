"""Interventions: causal mediation of subject-verb agreement in one model (docs/interventions.md;
Vig et al. 2020, Finlayson et al. 2021). The run's natural indirect effect of swapping the subject's
number per layer and site and per head, beside the random-init model and the same-number control;
then one agreement item and one site picked here: the log-probability differences of its clean, intervened,
noising and denoising runs and the item's effects."""

import streamlit as st

from apps import common
from probes.patching import Site
from workbench.analyses.interventions import (INTERVENTIONS, InterventionsConfig, intervention_kinds, item_effect,
                                              kept_items, mediation_sites)
from workbench.figures import interventions as IF


@st.cache_data(show_spinner="Tokenising the agreement items...", max_entries=16)
def items(path: str, intervention: str) -> tuple[list[tuple], list[str]]:
    """(item id, template, clean sentence, intervened sentence) of the kept items, and the site labels."""
    m, tok = common.model(path)
    cfg = InterventionsConfig()
    kept = kept_items(m, tok, intervention, cfg)
    return ([(r.id, r.source, " ".join(r.good), " ".join(new)) for r, new in kept],
            [s.label for s in mediation_sites(m, cfg)])


@st.cache_data(show_spinner="Patching...", max_entries=64)
def effect(path: str, item_id: str, intervention: str, site: str):
    """item_effect of one item at the site labelled `site`."""
    m, tok = common.model(path)
    cfg = InterventionsConfig()
    record = next(r for r, _ in kept_items(m, tok, intervention, cfg) if r.id == item_id)
    chosen: Site = next(s for s in mediation_sites(m, cfg) if s.label == site)
    return item_effect(m, tok, record, intervention, chosen, cfg.seed)


def main() -> None:
    st.title("Interventions")
    run = common.current_run()
    if run is None:
        return
    cards = common.view("model_cards", run)
    cards = cards[cards["kind"].isin(intervention_kinds())] if len(cards) else cards
    if not len(cards):
        common.no_results("interventions", "interventions")
        return
    table = common.view("table", run, "interventions")
    done = set() if table is None else set(table["model"])
    names = sorted(cards["name"], key=lambda n: n not in done)  # models with results first
    kinds = cards.set_index("name")["kind"]
    name = common.choose("Model", {f"{n} ({kinds[n]})": n for n in names}, "interventions_model")
    if name not in done:
        common.no_results("interventions", "interventions")
    else:
        st.plotly_chart(IF.interventions_layers_figure(table, name), width="stretch")
        st.plotly_chart(IF.interventions_heads_figure(table, name), width="stretch")
        if (table[table["model"] == name]["position"] != "all").any():
            st.plotly_chart(IF.interventions_positions_figure(table, name), width="stretch")
        attr = common.view("table", run, "interventions_attribution")
        if attr is not None and (attr["model"] == name).any():
            st.caption("Attribution patching against real patching (Spearman over sites, 95% interval over items)")
            st.dataframe(attr[attr["model"] == name].drop(columns=["model"]), width="stretch")
    st.subheader("One item, one site")
    path = cards.set_index("name").loc[name, "path"]
    intervention = common.pick("Intervention", list(INTERVENTIONS), "interventions_kind")
    rows, sites = items(path, intervention)
    if not rows:
        st.warning(f"No agreement item survives this model's tokenisation for {intervention} "
                   "(docs/interventions.md: items whose two verb forms are the same pieces are skipped).")
        return
    item = common.choose("Item (clean -> intervened)", {f"{t}: {a} -> {b}": i for i, t, a, b in rows}, "interventions_item")
    site = common.pick("Site", sites, "interventions_site")
    st.plotly_chart(IF.item_effect_figure(effect(path, item, intervention, site), site), width="stretch")


main()
