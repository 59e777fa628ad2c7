"""The sentence-attention widget shared by the Heads and Playground pages: layer/head pickers, a
notice for long sentences, the heatmap with dependency arcs and the BertViz-style lines; with a
second map of the same sentence (norm-weighted attention, Kobayashi et al. 2020), the two heatmaps
side by side."""

from __future__ import annotations

import numpy as np
import streamlit as st

from workbench import figures as F
from workbench.figures.attention import MAX_WORDS


def show_attention(sa, key: str, beside=None, labels: tuple[str, str] = ("raw attention", "norm-weighted")) -> None:
    """Draw a SentenceAttention (words, attn (L, H, n, n), arcs) with its pickers. With `beside`
    (the same sentence's maps another way), its heatmap is drawn next to the first, `labels` above."""
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
    if beside is None:
        left, right = st.columns(2)
        left.plotly_chart(F.attention_heatmap(sa, layer, head), width="stretch", key=f"{key}_heat")
    else:  # the two weightings' heatmaps side by side, the lines view of the first below
        cols = st.columns(2)
        for col, m, label, k in zip(cols, (sa, beside), labels, ("heat", "heat_beside")):
            fig = F.attention_heatmap(m, layer, head).update_layout(title=f"{label}: layer {layer}, head {head}")
            col.plotly_chart(fig, width="stretch", key=f"{key}_{k}")
        right = st.container()
    heads = right.multiselect("Heads in the lines view", list(range(H)), default=[head], key=f"{key}_heads")
    right.plotly_chart(F.attention_lines(sa, layer, heads, threshold=threshold), width="stretch",
                       key=f"{key}_lines")
    if sa.arcs:
        st.caption("Dependency arcs (spaCy): " + ", ".join(f"{sa.words[d]} -{lab}-> {sa.words[h]}"
                                                           for d, h, lab in sa.arcs[:40]))
