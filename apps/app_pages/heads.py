"""Heads: the layer x head grid coloured by role or by any score, the best head per relation, the
head similarity map, each role score beside its floors, and the attention of any head on a corpus or typed sentence. When the run's
head tables hold norm-weighted attention too (`workbench heads MODEL --set weightings='["raw","norm"]'`,
Kobayashi et al. 2020), the grid and the sentence's map are drawn both ways, side by side."""

import streamlit as st

from apps import common
from apps.attention_view import show_attention
from workbench import figures as F

DEFAULT_TEXT = "The keys to the cabinet are on the table near the door."
LABELS = {"raw": "raw attention", "norm": "norm-weighted (Kobayashi et al. 2020)"}


def grid_section(run: str) -> bool:
    """The head grids, relations and map; True when the run has norm-weighted tables for the model."""
    models = common.view("head_models", run)
    if not models:
        common.no_results("heads", "head-analysis")
        return False
    c1, c2 = st.columns(2)
    model = c1.selectbox("Model", models, key="heads_model")
    color = c2.selectbox("Colour by", ["role"] + common.view("head_scores", run, model), key="heads_color")
    weightings = common.view("head_weightings", run, model)
    both = len(weightings) > 1
    grids = [(w, common.view("head_grid", run, model, color, w)) for w in weightings]
    for col, (w, grid) in zip(st.columns(len(grids)) if both else [st.container()], grids):
        with col:
            if grid is None:
                common.no_results("heads_classes" if color == "role" else "heads", "head-role")
            else:
                title = f"{grid.model}: {grid.score} ({LABELS[w]})" if both else None
                st.plotly_chart(F.head_grid_figure(grid, title=title), width="stretch", key=f"heads_grid_{w}")
    weighting = (st.radio("Relations and map from", weightings, horizontal=True, key="heads_weighting",
                          format_func=LABELS.get) if both else "raw")
    left, right = st.columns(2)
    rel = common.view("best_heads", run, model, weighting)
    with left:
        if rel is None:
            common.no_results("relations", "per-relation")
        else:
            st.plotly_chart(F.relations_figure(rel), width="stretch")
    hmap = common.view("head_map", run, model, weighting)
    with right:
        if hmap is None:
            common.no_results("heads", "head-similarity map")
        else:
            st.plotly_chart(F.head_map_figure(hmap), width="stretch")
    floors = common.view("head_floors", run, model, weighting)
    if floors is not None:
        st.caption("Each role score's best head beside its floors: what a uniform head, a random-argmax head and "
                   "the same architecture at random initialisation score on the same sentences. A head has a role "
                   "only if its interval (ci_low, ci_high) lies above the floor; n_pass counts those heads.")
        st.dataframe(floors, hide_index=True, width="stretch")
    return both


def sentence_section(run: str, norm_default: bool) -> None:
    st.subheader("Attention on a sentence")
    stored = common.view("attention_models", run)
    checkpoints = common.view("model_paths", run)
    sources = (["corpus sentence"] if stored else []) + (["typed sentence"] if checkpoints else [])
    if not sources:
        common.no_results("attention", "attention")
        return
    source = st.radio("Sentence", sources, horizontal=True, key="heads_source")
    norm = st.checkbox("Norm-weighted attention beside raw (Kobayashi et al. 2020: alpha ||f(x)||)",
                       value=norm_default, key="heads_norm")
    try:
        if source == "corpus sentence":
            name = st.selectbox("Model", stored, key="heads_att_model")
            sents = common.view("attention_sentences", run, name)
            s = common.choose("Sentence", {f"{i}: {' '.join(w)[:120]}": i for i, w in enumerate(sents)}, "heads_sent")
            maps = lambda w: common.stored_attention(run, name, s, w)  # noqa: E731
        else:
            name = st.selectbox("Model", list(checkpoints), key="heads_ckpt")
            text = st.text_input("Sentence", DEFAULT_TEXT, key="heads_text")
            maps = lambda w: common.attention_for_text(checkpoints[name], text, w)  # noqa: E731
        sa = maps("raw")
    except (ValueError, FileNotFoundError, IndexError) as e:
        st.error(str(e))
        return
    beside = None
    if norm:
        try:
            beside = maps("norm")
        except FileNotFoundError as e:  # a stored sentence of a model whose checkpoint is not in the run
            st.info(str(e))
    show_attention(sa, "heads_att", beside, (LABELS["raw"], LABELS["norm"]))


def main() -> None:
    st.title("Heads")
    run = common.current_run()
    if run is None:
        return
    both = grid_section(run)
    sentence_section(run, norm_default=both)
    cross_section(run)


def cross_section(run) -> None:
    """The encoder-decoders' cross-attention heads (T5, BART), when the run has them."""
    best = common.view("cross_heads_best", run)
    if best is None:
        return
    st.subheader("Cross-attention heads")
    st.caption("Where each target position looks in the source, on the model's own noising of EWT test sentences: "
               "the best head per score (align_acc: share of aligned target tokens whose most-attended source "
               "position is their copy, T5's sentinels or BART's surviving tokens; entropy: the lowest), its 95% "
               "interval over sentences, and the mean over the model's heads.")
    st.dataframe(best, hide_index=True, width="stretch")


main()
