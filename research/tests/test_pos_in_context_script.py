"""research/scripts/pos_in_context.py: how each mode builds its row, and that "single" reads the activation
store's vectors (so its probe is the target check's)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from workbench.store import extract

from .scripts import load_script


@pytest.fixture(scope="module")
def pic():
    return load_script("pos_in_context")


def _encs(lengths):
    """Fake encodings: sentence s is ids s*100, s*100+1, ... (so every id tells its sentence)."""
    return [SimpleNamespace(ids=[100 * s + k for k in range(n)]) for s, n in enumerate(lengths)]


def test_context_grows_by_whole_neighbours_within_the_room(pic):
    encs = _encs([5, 3, 4, 6, 2])
    rng = np.random.default_rng(0)
    ids, off = pic.row_ids(encs, 2, "context", np.zeros(0), rng, room=12)
    # sentence 1 (3) fits before, sentence 3 (6) never fits after, then sentence 0 (5) fills 12 exactly
    assert ids == encs[0].ids + encs[1].ids + encs[2].ids and off == 8
    ids, off = pic.row_ids(encs, 2, "context", np.zeros(0), rng, room=20)
    assert ids == sum((e.ids for e in encs), []) and off == 8
    assert pic.row_ids(encs, 2, "single", np.zeros(0), rng, room=12) == (encs[2].ids, 0)


def test_filler_and_prefill_put_unrelated_text_after_or_before(pic):
    encs = _encs([4])
    filler = np.arange(1000, 1100)
    ids, off = pic.row_ids(encs, 0, "filler", filler, np.random.default_rng(1), room=10)
    assert ids[:4] == encs[0].ids and off == 0 and len(ids) == 10
    assert all(1000 <= t < 1100 for t in ids[4:]) and np.all(np.diff(ids[4:]) == 1)  # one contiguous span
    ids, off = pic.row_ids(encs, 0, "prefill", filler, np.random.default_rng(1), room=10)
    assert ids[6:] == encs[0].ids and off == 6 and all(1000 <= t < 1100 for t in ids[:6])


def test_single_mode_reads_the_activation_stores_vectors(pic, tmp_path):
    texts = ["the cat sat on the mat", "a dog ran in the park", "unbelievable things happen today"] * 4
    tok = Tokenizer.train_wordpiece(texts, vocab_size=60)
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=64, dropout=0.0, position="rope")).eval()
    words = [["the", "cat", "sat"], ["unbelievable", "things", "happen", "today"], ["a", "dog"]]
    sents = [SimpleNamespace(words=w, upos=[f"T{i}" for i in range(len(w))]) for w in words]
    X, y = pic.vectors(model, tok, sents, "single", np.zeros(0), seq_len=64)
    store = extract(model, tok, words, tmp_path, progress=False)
    assert list(y) == [u for s in sents for u in s.upos]
    for layer in range(3):
        np.testing.assert_allclose(X[layer].astype(np.float32), np.asarray(store.layer(layer), np.float32),
                                   rtol=2e-3, atol=2e-3)
    # the longer modes probe the same words: "context" on these three sentences keeps every label
    _, y_ctx = pic.vectors(model, tok, sents, "context", np.zeros(0), seq_len=64)
    assert list(y_ctx) == list(y)
