"""Flow: how information moves through one model (docs/flow.md). The run's Voita et al. (2019)
token-identity curves, logit and tuned lens, and the attribution methods' faithfulness, each beside
its floor (per stack: an encoder-decoder's teacher-forced decoder, "<model>;decoder", beside its
encoder); then, for a sentence the user types, the lens' top tokens per layer and every attribution
method's token scores side by side."""

import streamlit as st

from apps import common
from workbench.analyses.flow import flow_kinds, flow_sentence, saved_tuned_lens
from workbench.figures import flow as FF

DEFAULT_TEXT = "The cat sat on the mat because it was tired ."


@st.cache_data(show_spinner="Running the model...", max_entries=32)
def sentence(path: str, text: str, k: int):
    """flow_sentence of a checkpoint on one text, with its tuned lens where the flow step saved one."""
    m, tok = common.model(path)
    return flow_sentence(m, tok, text, lens=saved_tuned_lens(m, path), k=k)


def main() -> None:
    st.title("Flow")
    run = common.current_run()
    if run is None:
        return
    mi, lens, attr = (common.view("table", run, t) for t in ("flow_mi", "flow_lens", "flow_attribution"))
    cards = common.view("model_cards", run)
    # the models with the whole suite, and any other with MI curves in the run
    # (docs/flow.md, "Which families get what")
    if len(cards):
        cards = cards[cards["kind"].isin(flow_kinds()) | cards["name"].isin(set(mi["model"]) if mi is not None else ())]
    if not len(cards):
        common.no_results("flow_mi", "flow")
        return
    name = common.choose("Model", {f"{n} ({k})": n for n, k in zip(cards["name"], cards["kind"])}, "flow_model")
    # the model's stacks in the tables: the model itself, then e.g. "<name>;decoder"
    stacks = [] if mi is None else sorted(m for m in set(mi["model"]) if m == name or m.startswith(name + ";"))
    if not stacks:
        common.no_results("flow_mi", "flow")
    for stack in stacks:
        st.plotly_chart(FF.flow_mi_figure(mi, stack), width="stretch")
        for table, figure in ((lens, FF.flow_lens_figure), (attr, FF.flow_attribution_figure)):
            if table is not None and (table["model"] == stack).any():
                st.plotly_chart(figure(table, stack), width="stretch")
    kind = cards.set_index("name").loc[name, "kind"]
    lensed = [] if lens is None else [s for s in stacks if (lens["model"] == s).any()]
    # the sentence view reads the model's own stack through its LM head: a kind with the whole suite,
    # and a model the run read with a lens (none: its LM head is untrained, or it is a finetuned classifier)
    if kind not in flow_kinds() or (stacks and not lensed):
        has = "the token-identity curves" + (f" and the lens of {', '.join(lensed)}" if lensed else " only")
        why = (f"a {kind} model's own stack has no LM readout" if kind not in flow_kinds() else
               "the run read no lens of it: its LM head is untrained (its card) or it is a finetuned classifier")
        st.info(f"{name} has {has}; no sentence view: {why} (docs/flow.md, 'Which families get what').")
        return
    st.subheader("One sentence")
    path = cards.set_index("name").loc[name, "path"]
    k = int(st.number_input("Top k", 1, 10, 3, key="flow_k"))
    text = st.text_input("Text", DEFAULT_TEXT, key="flow_text")
    try:
        out = sentence(path, text, k)
    except ValueError as e:
        st.warning(str(e))
        return
    t = out["target"].iloc[0]
    st.caption(f"Attributed prediction: token {t['token']!r} at position {t['position']}, "
               f"log p = {t['log_prob']:.2f} (docs/flow.md: a decoder's last token given the rest, "
               "an encoder's one masked word piece).")
    left, right = st.columns(2)
    lens_top = out["lens"].assign(cell=lambda d: d["token"] + " (" + d["prob"].round(2).astype(str) + ")")
    for col, (name_, g) in zip((left, right), lens_top.groupby("lens", sort=False)):
        col.markdown(f"**{name_} lens: top tokens per layer**")
        col.dataframe(g.pivot(index="layer", columns="rank", values="cell"), width="stretch")
    st.plotly_chart(FF.flow_sentence_figure(out["attributions"]), width="stretch")
    st.dataframe(out["attributions"].pivot(index="method", columns="position", values="score").round(4),
                 width="stretch")


main()
