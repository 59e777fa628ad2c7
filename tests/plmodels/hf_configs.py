"""transformers configs of the small random reference models the parity tests build (RoBERTa,
DistilBERT, ALBERT, GPT-NeoX), shared by each family's parity module and the all-families import test.
transformers is a test extra: without it a module importing this one is skipped at collection."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the test extras: pip install -e '.[test]'")

SIZES = {"vocab_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
         "max_position_embeddings": 24}
ROBERTA_PAD = 1
# right padding (rows 0, 1) and left padding (row 2); RoBERTa's <s>=0, <pad>=1, </s>=2
ROBERTA_IDS = torch.tensor([[0, 5, 6, 7, 8, 9, 2, 1], [0, 10, 11, 12, 2, 1, 1, 1], [1, 1, 0, 13, 14, 15, 16, 2]])
def roberta_config(**overrides):
    return transformers.RobertaConfig(**{
        **SIZES, "hidden_size": 32, "type_vocab_size": 1, "pad_token_id": ROBERTA_PAD, "bos_token_id": 0,
        "eos_token_id": 2, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-5,
        **overrides})


def distil_config(**overrides):
    return transformers.DistilBertConfig(**{
        "vocab_size": 40, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48, "max_position_embeddings": 24,
        "dropout": 0.0, "attention_dropout": 0.0, **overrides})


def albert_config(**overrides):
    return transformers.AlbertConfig(**{
        "vocab_size": 40, "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
        "intermediate_size": 48, "max_position_embeddings": 24, "layer_norm_eps": 1e-6, **overrides})


NEOX_V, NEOX_H = 50, 4  # vocabulary, heads (head size 8)
# (rotary_pct, use_parallel_residual, tie_word_embeddings, rotary_emb_base)
CASES = {
    "pythia": (0.25, True, False, 10000),    # Pythia: 2 of 8 channels rotated, parallel, untied
    "full-rotary-sequential": (1.0, False, False, 10000),
    "half-rotary-tied": (0.5, True, True, 10000),
    "quarter-sequential-base": (0.25, False, False, 500),
}


def neox_config(pct, parallel, tie, base, **overrides):
    return transformers.GPTNeoXConfig(**{
        "vocab_size": NEOX_V, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": NEOX_H, "intermediate_size": 48,
        "max_position_embeddings": 24, "rotary_pct": pct, "rotary_emb_base": base, "use_parallel_residual": parallel,
        "tie_word_embeddings": tie, "layer_norm_eps": 3e-5, **overrides})
