"""Minimal-pair sentence scores: exact against transformers (GPT-2's sentence log-probability, BERT's
pseudo-log-likelihood computed token by token), a planted model, and every model kind scored the
same alone as in a batch."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import transformers

from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig
from plmodels.elmo import ElmoBiLM, ElmoConfig, TransformerBiLM, TransformerBiLMConfig
from plmodels.hf.gpt2 import import_hf_gpt2
from plmodels.hf.bert import import_hf_bert
from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig
from plmodels.tokenizer import Tokenizer
from plmodels.training.data import with_sentinels
from plmodels.xlnet import XLNet, XLNetConfig
from probes.sentence_scores import (BATCH_TOKENS, KIND_SCORERS, SCORERS, _mlm_logp_at, pll_scores,
                                    score_pairs_together, scorers_for)
from tests.plmodels.hf_models import hf_gpt2
from tests.plmodels.hf_bert_folder import save_bert_folder
from tests.plmodels.hf_files import write_gpt2_files

pytestmark = pytest.mark.usefixtures("one_thread")

SENTENCES = [["the", "cat", "sat", "on", "the", "mat"], ["the", "dogs", "ran"], ["cats", "sat"],
             ["the", "dog", "ran", "on", "the", "cats", "mat"]]
PAIRS = [(["the", "cat", "sat"], ["the", "cats", "sat"], 1), (["the", "dogs", "ran"], ["the", "dog", "ran"], 1),
         (["the", "dog", "sat", "on", "the", "mat"], ["the", "dog", "sat", "on", "the", "cats"], 5)]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A random transformers GPT-2 with its BPE files, and our import of it."""
    root = tmp_path_factory.mktemp("gpt2")
    vocab = write_gpt2_files(root / "tok")
    ref = hf_gpt2(vocab, tie=True, seed=0)
    ref.save_pretrained(str(root / "hf"))
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(root / "tok" / f, root / "hf" / f)
    ours, tok = import_hf_gpt2(root / "hf", root / "ckpt")
    return ref, ours.eval(), tok


def test_clm_score_equals_gpt2lmheadmodel(gpt2):
    ref, ours, tok = gpt2
    got = SCORERS["clm"].sentence(ours, tok.encode_words_batch(SENTENCES), tok, 64)  # several batches
    for s, words in enumerate(SENTENCES):
        enc = tok.encode_words(words)
        ids = torch.tensor([enc.ids])
        with torch.no_grad():
            logp = torch.log_softmax(ref(ids).logits[0].double(), -1)
        start = enc.word_spans[0][0]
        want = sum(float(logp[t - 1, enc.ids[t]]) for t in range(start, len(enc.ids)))
        assert start == 1 and got[s] == pytest.approx(want, abs=1e-4)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A random transformers BertForMaskedLM with a WordPiece vocab.txt, and our import of it."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=24, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    ref = transformers.BertForMaskedLM(cfg).eval()
    folder = save_bert_folder(ref, tmp_path_factory.mktemp("bert"))
    ours, tok = import_hf_bert(folder, folder / "ckpt")
    return ref, ours.eval(), tok


def _hf_pll(ref, tok, words, l2r: bool) -> float:
    """BertForMaskedLM, one forward per body token: that token (and with l2r its word's later pieces) masked."""
    enc = tok.encode_words(words)
    total = 0.0
    for s, e in enc.word_spans:
        for p in range(s, e):
            ids = list(enc.ids)
            for q in range(p, e if l2r else p + 1):
                ids[q] = tok.mask_id
            with torch.no_grad():
                logits = ref(torch.tensor([ids])).logits[0, p].double()
            total += float(torch.log_softmax(logits, -1)[enc.ids[p]])
    return total


@pytest.mark.parametrize("l2r", [False, True])
def test_pll_equals_bert_for_masked_lm_token_by_token(bert, l2r):
    ref, ours, tok = bert
    encs = tok.encode_words_batch(SENTENCES)
    assert any(e - s > 1 for enc in encs for s, e in enc.word_spans), "a multi-piece word (cat ##s) is needed"
    got = pll_scores(ours, encs, tok.mask_id, within_word_l2r=l2r, batch_tokens=40)
    for s, words in enumerate(SENTENCES):
        assert got[s] == pytest.approx(_hf_pll(ref, tok, words, l2r), abs=1e-4)
    other = pll_scores(ours, encs, tok.mask_id, within_word_l2r=not l2r)
    assert not np.allclose(got, other), "PLL and PLL-word-l2r must differ on a multi-piece word"
    pairs = [(SENTENCES[k], SENTENCES[k - 1], 0) for k in range(len(SENTENCES))]  # the registry's scorer, pair by pair
    scored = SCORERS["pll_word_l2r" if l2r else "pll"].score_pairs(ours, tok, pairs, batch_tokens=40)
    np.testing.assert_allclose(scored, np.stack([got, np.roll(got, 1)], 1), atol=1e-5)


def test_masked_word_is_the_pll_term_of_a_single_piece_word_and_nan_otherwise(bert):
    ref, ours, tok = bert
    pairs = [(["the", "dog", "sat"], ["the", "cat", "sat"], 1), (["the", "cat", "sat"], ["the", "cats", "sat"], 1)]
    got = SCORERS["masked_word"].score_pairs(ours, tok, pairs)
    enc = tok.encode_words(["the", "dog", "sat"])
    ids = list(enc.ids)
    ids[2] = tok.mask_id
    with torch.no_grad():
        logp = torch.log_softmax(ref(torch.tensor([ids])).logits[0, 2].double(), -1)
    assert got[0, 0] == pytest.approx(float(logp[tok.encode_words(["dog"]).ids[1]]), abs=1e-4)
    assert got[0, 1] == pytest.approx(float(logp[tok.encode_words(["cat"]).ids[1]]), abs=1e-4)
    assert np.isnan(got[1]).all()  # "cats" is cat ##s: not a single-token contrast


def test_masked_word_reads_both_forms_off_one_forward(bert, monkeypatch):
    """One masked forward a pair, both forms read off it: the same numbers as one forward per form."""
    _, ours, tok = bert
    pairs = [(["the", "dog", "sat"], ["the", "cat", "sat"], 1), (["the", "dog", "ran"], ["the", "cat", "ran"], 1),
             (["the", "cat", "sat", "on", "the", "mat"], ["the", "dog", "sat", "on", "the", "mat"], 1)]
    calls = []
    forward = ours.masked_hidden
    monkeypatch.setattr(ours, "masked_hidden", lambda ids, select: calls.append(len(ids)) or forward(ids, select))
    got = SCORERS["masked_word"].score_pairs(ours, tok, pairs)
    assert sum(calls) == len(pairs)                                  # rows forwarded: one a pair
    rows, pos, good, bad = [], [], [], []                              # one forward per form, as before
    for g, b, c in pairs:
        eg, eb = tok.encode_words(g), tok.encode_words(b)
        ids, at = list(eg.ids), eg.word_spans[c][0]
        ids[at] = tok.mask_id
        rows, pos, good, bad = rows + [ids], pos + [at], good + [eg.ids[at]], bad + [eb.ids[at]]
    want = np.stack([_mlm_logp_at(ours, rows, pos, good, BATCH_TOKENS),
                     _mlm_logp_at(ours, rows, pos, bad, BATCH_TOKENS)], axis=1)
    np.testing.assert_array_equal(got, want)
    assert sum(calls) == 3 * len(pairs) and not np.isnan(got).any()   # the old path: two more a pair


def test_a_planted_model_that_makes_the_grammatical_form_certain_scores_one(gpt2):
    """A hook on the decoder's output puts all next-token mass on the grammatical sentence's next token
    whenever the prefix is one of a grammatical sentence: every pair is then won."""
    _, ours, tok = gpt2
    good = [tok.encode_words(g).ids for g, _, _ in PAIRS]

    def plant(module, args, out):
        ids = args[0]
        logits = torch.full_like(out.logits, -1e4)
        for b in range(ids.shape[0]):
            for t in range(ids.shape[1]):
                nxt = [g[t + 1] for g in good if len(g) > t + 1 and g[: t + 1] == ids[b, : t + 1].tolist()]
                if nxt:  # the grammatical continuations share the mass
                    logits[b, t, nxt] = 0.0
                else:
                    logits[b, t] = 0.0  # uniform elsewhere
        out.logits = logits
        return out

    handle = ours.register_forward_hook(plant)
    try:
        s = SCORERS["clm"].score_pairs(ours, tok, PAIRS)
    finally:
        handle.remove()
    assert (s[:, 0] > s[:, 1]).all() and (s[:, 0] > -5).all() and (s[:, 1] < -1e3).all()
    plain = SCORERS["clm"].score_pairs(ours, tok, PAIRS)
    assert (plain[:, 0] < -5).all()  # without the hook the model is random


# ---------------------------------------------------------------- every kind
TEXTS = ["the cat sat on the mat", "the dogs ran on the mats", "a cat and a dog sat"] * 20


@pytest.fixture(scope="module")
def wordpiece():
    return Tokenizer.train_wordpiece(TEXTS, vocab_size=60)


def _models(tok: Tokenizer):
    V = tok.vocab_size
    t5tok = with_sentinels(tok, 4)
    torch.manual_seed(0)
    enc = dict(vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=32)
    s2s = dict(d_model=16, n_layers=2, n_decoder_layers=2, n_heads=2, d_ff=32, max_positions=32, dropout=0.0)
    return {
        "encoder": (Encoder(EncoderConfig(**enc)), tok),
        "electra": (Encoder(EncoderConfig(**enc, use_rtd=True)), tok),
        "decoder": (Decoder(DecoderConfig(**enc)), tok),
        "bilm": (ElmoBiLM(ElmoConfig(vocab_size=V, d_embed=8, d_hidden=24, d_proj=8, n_layers=2, dropout=0.0)), tok),
        "tbilm": (TransformerBiLM(TransformerBiLMConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                                        max_positions=32, dropout=0.0)), tok),
        "xlnet": (XLNet(XLNetConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=0.0)), tok),
        "t5": (Seq2Seq(Seq2SeqConfig.t5(vocab_size=t5tok.vocab_size, **s2s)), t5tok),
        "bart": (Seq2Seq(Seq2SeqConfig.bart(vocab_size=V, **s2s)), tok),
    }


EXPECTED = {"encoder": ["pll", "pll_word_l2r", "masked_word"], "electra": ["pll", "pll_word_l2r", "masked_word", "rtd"],
            "decoder": ["clm"], "bilm": ["bilm"], "tbilm": ["bilm"], "xlnet": ["xlnet_l2r"],
            "t5": ["t5_target", "t5_sentinel"], "bart": ["bart_target"]}


def test_every_kind_has_its_scorers_and_scores_a_pair_alone_as_in_a_batch(wordpiece):
    pairs = [(g.split(), b.split(), c) for g, b, c in (
        ("the cat sat on the mat", "the cat sat on the mats", 5), ("the dogs ran", "the dog ran", 1),
        ("a cat and a dog sat", "a cat and a dogs sat", 4))]
    assert set(KIND_SCORERS) == {"encoder", "decoder", "bilm", "tbilm", "xlnet", "seq2seq"}
    for name, (model, tok) in _models(wordpiece).items():
        model.eval()
        scorers = scorers_for(model, tok)
        assert [s.name for s in scorers] == EXPECTED[name], name
        assert [s.name for s in scorers_for(model, tok, lm_head_trained=False)] == (["rtd"] if name == "electra" else [])
        for sc in scorers:
            together = sc.score_pairs(model, tok, pairs, batch_tokens=30)
            alone = np.concatenate([sc.score_pairs(model, tok, [p]) for p in pairs])
            finite = np.isfinite(together)
            assert finite.any() and (together[finite] < 0).all(), (name, sc.name)  # log-probabilities
            np.testing.assert_allclose(together, alone, atol=1e-4, err_msg=f"{name} {sc.name}")
            assert not np.allclose(together[:, 0], together[:, 1]), (name, sc.name)  # the pair is told apart



def test_masked_lm_scorers_together_equal_each_alone_and_share_their_forwards(wordpiece, monkeypatch):
    """`score_pairs_together` gives each masked-LM scorer's own scores (1e-5), with one forward per
    distinct masked row: PLL and PLL-word-l2r share the rows of single-piece words and last pieces, the
    masked word shares PLL's row at a single-piece critical word, good and bad sentence share that row."""
    model, tok = _models(wordpiece)["encoder"]
    model.eval()
    pairs = [(g.split(), b.split(), c) for g, b, c in (
        ("the cat sat on the mat", "the cat sat on the mats", 5), ("the cats ran", "the cat ran", 1),
        ("a cat and a dog sat", "a dog and a dog sat", 1))]
    scorers = [SCORERS[n] for n in ("pll", "pll_word_l2r", "masked_word")]
    assert any(e - s > 1 for g, b, _ in pairs for w in (g, b) for s, e in tok.encode_words(w).word_spans)
    alone = {sc.name: sc.score_pairs(model, tok, pairs, batch_tokens=30) for sc in scorers}
    rows = []
    forward = model.masked_hidden
    monkeypatch.setattr(model, "masked_hidden", lambda ids, select: rows.append(len(ids)) or forward(ids, select))
    together = score_pairs_together(model, tok, pairs, scorers, batch_tokens=30)
    assert list(together) == [sc.name for sc in scorers]
    for sc in scorers:
        np.testing.assert_allclose(together[sc.name], alone[sc.name], atol=1e-5, err_msg=sc.name)
    assert np.isfinite(together["masked_word"][[0, 2]]).all() and np.isnan(together["masked_word"][1]).all()
    # by hand: every body token of every distinct sentence once (PLL), plus PLL-word-l2r's rows that mask
    # more than one piece (a word's pieces before its last), less the critical rows the bad sentence
    # shares with the good one (single-piece critical word in both: the same row)
    sents = {tuple(w) for g, b, _ in pairs for w in (g, b)}
    encs = [tok.encode_words(list(w)) for w in sents]
    pll_rows = sum(e - s for enc in encs for s, e in enc.word_spans)
    extra = sum(e - s - 1 for enc in encs for s, e in enc.word_spans)
    shared = sum(1 for g, b, c in pairs if all(np.diff(tok.encode_words(w).word_spans[c]) == 1 for w in (g, b)))
    assert sum(rows) == pll_rows + extra - shared < sum(len(sc.masked(tok, pairs).queries) for sc in scorers)
