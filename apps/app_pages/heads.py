"""Heads: the layer x head grid coloured by role or by any score, the best head per relation, the
head similarity map, and the attention of any head on a corpus or typed sentence."""

import streamlit as st

from apps import common
from apps.attention_view import show_attention
from workbench import figures as F

DEFAULT_TEXT = "The keys to the cabinet are on the table near the door."


def grid_section(run: str) -> None:
    models = common.view("head_models", run)
    if not models:
        common.no_results("heads", "head-analysis")
        return
    c1, c2 = st.columns(2)
    model = c1.selectbox("Model", models, key="heads_model")
    color = c2.selectbox("Colour by", ["role"] + common.view("head_scores", run, model), key="heads_color")
    grid = common.view("head_grid", run, model, color)
    if grid is None:
        common.no_results("heads_classes" if color == "role" else "heads", "head-role")
    else:
        st.plotly_chart(F.head_grid_figure(grid), width="stretch")
    left, right = st.columns(2)
    rel = common.view("best_heads", run, model)
    with left:
        if rel is None:
            common.no_results("relations", "per-relation")
        else:
            st.plotly_chart(F.relations_figure(rel), width="stretch")
    hmap = common.view("head_map", run, model)
    with right:
        if hmap is None:
            common.no_results("heads", "head-similarity map")
        else:
            st.plotly_chart(F.head_map_figure(hmap), width="stretch")


def sentence_section(run: str) -> None:
    st.subheader("Attention on a sentence")
    stored = common.view("attention_models", run)
    checkpoints = common.view("model_paths", run)
    sources = (["corpus sentence"] if stored else []) + (["typed sentence"] if checkpoints else [])
    if not sources:
        common.no_results("attention", "attention")
        return
    source = st.radio("Sentence", sources, horizontal=True, key="heads_source")
    try:
        if source == "corpus sentence":
            name = st.selectbox("Model", stored, key="heads_att_model")
            sents = common.view("attention_sentences", run, name)
            s = common.choose("Sentence", {f"{i}: {' '.join(w)[:120]}": i for i, w in enumerate(sents)}, "heads_sent")
            sa = common.stored_attention(run, name, s)
        else:
            name = st.selectbox("Model", list(checkpoints), key="heads_ckpt")
            text = st.text_input("Sentence", DEFAULT_TEXT, key="heads_text")
            sa = common.attention_for_text(checkpoints[name], text)
    except (ValueError, FileNotFoundError, IndexError) as e:
        st.error(str(e))
        return
    show_attention(sa, "heads_att")


def main() -> None:
    st.title("Heads")
    run = common.current_run()
    if run is None:
        return
    grid_section(run)
    sentence_section(run)


main()
