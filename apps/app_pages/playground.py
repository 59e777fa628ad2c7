"""Playground: type a sentence; see an encoder's masked-token predictions or a decoder's
continuation, next to the model's attention on it."""

import streamlit as st

from plmodels.families import family
from apps import common
from apps.attention_view import show_attention
from workbench import figures as F
from workbench.presentation import views

ENCODER_TEXT = "The cat sat on the [MASK] ."
DECODER_TEXT = "Once upon a time"


def main() -> None:
    st.title("Playground")
    run = common.current_run()
    if run is None:
        return
    cards = common.view("model_cards", run)
    if not len(cards):
        common.no_results("models", "checkpoint")
        return
    name = common.choose("Model", {f"{n} ({k})": n for n, k in zip(cards["name"], cards["kind"])}, "play_model")
    row = cards.set_index("name").loc[name]
    kind, path = row["kind"], row["path"]
    try:
        common.model(path)
    except (OSError, ValueError) as e:
        st.error(f"Could not load {path}: {e}. Create a checkpoint with `{views.missing_command('models')}`.")
        return
    masked = family(kind).lm_inputs == "masked"  # fill in [MASK]s; else continue the text
    default = ENCODER_TEXT if masked else DECODER_TEXT
    k = st.number_input("Top k", 1, 20, 5, key="play_k")
    text = st.text_input("Text" + (" (put [MASK] where a word should be predicted)" if masked else ""),
                         default, key=f"play_text_{kind}")
    left, right = st.columns(2)
    try:
        if masked:
            preds = common.predictions(path, kind, text, int(k))
            left.plotly_chart(F.predictions_figure(preds, "Masked-token predictions"), width="stretch")
        else:
            cont, preds = common.predictions(path, kind, text, int(k))
            left.markdown(f"**Continuation:** {text}**{cont}**")
            left.plotly_chart(F.predictions_figure(preds, "Next token after the prompt"), width="stretch")
        right.dataframe(preds, hide_index=True, width="stretch")
    except ValueError as e:
        left.warning(str(e))
    st.subheader("Attention")
    try:
        sa = common.attention_for_text(path, text.replace("[MASK]", "mask"))
    except ValueError as e:
        st.warning(str(e))
        return
    show_attention(sa, "play_att")


main()
