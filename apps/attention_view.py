"""The sentence-attention widget shared by the Heads and Playground pages: layer/head pickers, a
notice for long sentences, the heatmap with dependency arcs and the BertViz-style lines."""

from __future__ import annotations

import numpy as np
import streamlit as st

from workbench import figures as F
from workbench.figures.attention import MAX_WORDS


def show_attention(sa, key: str) -> None:
    """Draw a SentenceAttention (words, attn (L, H, n, n), arcs) with its pickers."""
    L, H = sa.attn.shape[:2]
    c1, c2, c3 = st.columns(3)
    layer = c1.selectbox("Layer", list(range(L)), index=L - 1 if L < 3 else L // 2, key=f"{key}_layer")
    head = c2.selectbox("Head", list(range(H)), key=f"{key}_head")
    threshold = c3.slider("Line threshold", 0.01, 0.5, 0.1, key=f"{key}_thr")
    if len(sa.words) > MAX_WORDS:
        st.warning(f"The sentence has {len(sa.words)} words: showing the first {MAX_WORDS}.")
    if np.isnan(sa.attn[layer, head]).all():
        st.info(f"Head {head} of layer {layer} was pruned.")
        return
    left, right = st.columns(2)
    left.plotly_chart(F.attention_heatmap(sa, layer, head), width="stretch", key=f"{key}_heat")
    heads = right.multiselect("Heads in the lines view", list(range(H)), default=[head], key=f"{key}_heads")
    right.plotly_chart(F.attention_lines(sa, layer, heads, threshold=threshold), width="stretch",
                       key=f"{key}_lines")
    if sa.arcs:
        st.caption("Dependency arcs (spaCy): " + ", ".join(f"{sa.words[d]} -{lab}-> {sa.words[h]}"
                                                           for d, h, lab in sa.arcs[:40]))
