"""workbench.analyses.heads glue: a head forced (by a pattern hook) to attend to the previous token is
found positional -1; the head picked on dev is the one reported on test, with its test accuracy;
too-long sentences are counted; a forced induction head is found on repeated random tokens."""
import json

import numpy as np
import pytest
import torch

from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from probes.heads import HEAD_COLUMNS, RELATION_COLUMNS, HeadConfig, HeadStats, Sentence, null_heads
from workbench.analyses.heads import (
    HeadRunConfig,
    analyse_loaded,
    fits,
    positional_ceiling,
    sentence_attention,
    sentence_pieces,
    token_positional_shares,
    ud_tokens,
)
from workbench.store import Store, special_token_columns, word_attention_maps

from .ud_heads import MAX_POS, MAX_TREE_POS, N_SENT, RUN, ud_sentences, word_vocab_tokenizer


def _previous_token(t, name):
    """Head 0: every token attends to the token before it ([CLS] to itself)."""
    T = t.shape[-1]
    P = torch.zeros(T, T)
    P[0, 0] = 1.0
    P[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    t = t.clone()
    t[:, 0] = P
    return t


@pytest.fixture(scope="module")
def forced(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heads")
    tok = word_vocab_tokenizer(tmp)
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=MAX_POS, dropout=0.0)).eval()
    with model.hooks(fwd=[("blocks.1.attn.pattern", _previous_token)]):
        tables = analyse_loaded(model, tok, tmp / "out", RUN, model_name="forced", progress=False)
    return tmp / "out", tok, tables


def _score(tables, layer, head, score):
    h = tables["heads"]
    return float(h[(h.layer == layer) & (h["head"] == head) & (h.score == score)]["value"].iloc[0])


def test_forced_previous_token_head_is_positional_minus_one(forced):
    _, _, t = forced
    assert _score(t, 1, 0, "positional_share:-1") >= 0.95
    assert _score(t, 0, 0, "positional_share:-1") < 0.9  # an untouched random head is not
    c = t["heads_classes"]
    roles = set(c[(c.layer == 1) & (c["head"] == 0)]["role"])
    assert "positional:-1" in roles
    assert "positional:-1" not in set(c[c.layer == 0]["role"])


def test_forced_previous_token_head_scores_the_positional_ceiling(forced):
    out, _, t = forced
    rec = json.loads((out / "heads_run.json").read_text())
    # the forced head is the ideal token-level -1 head, on the same dev sentences
    assert _score(t, 1, 0, "positional_share:-1") == pytest.approx(rec["positional_ceiling"]["-1"])
    assert 0.9 < rec["positional_ceiling"]["-1"] <= 1.0
    assert _score(t, 1, 0, "positional_share:-1:tokens") == 1.0
    assert _score(t, 1, 1, "positional_share:-1:tokens") < 0.9 and _score(t, 1, 0, "positional_share:+1:tokens") == 0.0


def test_positional_ceiling_by_hand(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat",
                                 "un", "##der", "##neath"]) + "\n")
    tok = Tokenizer.from_bert_vocab(vocab, lowercase=False)
    sents = [["cats", "the", "underneath", "sat"], ["sat"]]
    assert [b - a for a, b in tok.encode_words(sents[0]).word_spans] == [2, 1, 3, 1]
    # -1: "the" (1 subword) and "sat" (1) point back; "underneath" (3) gives 2/3 to itself.
    # +1: "the" points ahead; "cats" (2) ties itself and "the", and a tie goes to the lower index.
    # The one-word sentence has no neighbour at either offset and counts for neither.
    assert positional_ceiling(tok, sents) == pytest.approx({"-1": 2 / 3, "+1": 1 / 3})
    assert all(np.isnan(v) for v in positional_ceiling(tok, []).values())
    # A model whose layer-1 head 0 is that ideal -1 head: 1.0 on tokens, the ceiling on words.
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=16, dropout=0.0)).eval()
    with model.hooks(fwd=[("blocks.1.attn.pattern", _previous_token)]):
        shares = token_positional_shares(model, tok, sents)
    assert shares[-1][1, 0] == 1.0 and shares[1][1, 0] == 0.0


def test_tables_schemas(forced):
    _, _, t = forced
    assert list(t["heads"].columns) == HEAD_COLUMNS + ["weighting"]
    assert list(t["heads_classes"].columns[:4]) == ["model", "layer", "head", "role"]
    assert t["heads_classes"].columns[-1] == "weighting"
    assert list(t["relations"].columns) == RELATION_COLUMNS + ["weighting"]
    assert list(t["head_similarity"].columns) == ["model", "layer", "head", "x", "y", "weighting"]
    assert len(t["head_similarity"]) == 4 and set(t["heads"]["model"]) == {"forced"}
    assert all(set(df["weighting"]) == {"raw"} for df in t.values())  # the default: raw attention only


def _stats_from_store(path, split, tok):
    sents = [s for s in ud_sentences("ewt", split)[:N_SENT] if fits(tok, s.words, MAX_POS)]
    st = HeadStats(HeadConfig(), special_names=("cls", "sep"))
    store = Store(path)
    assert store.n_sentences == len(sents)
    for i, s in enumerate(sents):
        st.update(Sentence(attn=store.sentence_attention(i), special=store.sentence_special(i),
                           heads=np.asarray(s.heads), deprels=s.deprels))
    return st


def test_head_picked_on_dev_is_reported_on_test(forced):
    out, tok, t = forced
    rec = json.loads((out / "heads_run.json").read_text())
    dev, test = (_stats_from_store(rec["stores"][k], k, tok) for k in ("dev", "test"))
    dsc, tsc = dev.score_arrays(), test.score_arrays()
    rel = t["relations"]
    checked = 0
    for r in rel[(rel.n_dev > 0) & (rel.n_test > 0)].itertuples():
        key = f"syntactic_acc:{r.relation}:{r.direction}"
        assert r.dev_acc == pytest.approx(np.nanmax(dsc[key]))            # picked on dev ...
        assert r.dev_acc == pytest.approx(dsc[key][r.best_layer, r.best_head])
        assert r.test_acc == pytest.approx(tsc[key][r.best_layer, r.best_head])  # ... reported on test
        assert r.ci_low <= r.test_acc + 1e-9 and r.test_acc <= r.ci_high + 1e-9
        checked += 1
    assert checked >= 5


def test_too_long_sentences_are_counted(forced):
    out, tok, _ = forced
    rec = json.loads((out / "heads_run.json").read_text())
    for split in ("dev", "test"):
        n_long = sum(not fits(tok, s.words, MAX_POS) for s in ud_sentences("ewt", split)[:N_SENT])
        assert rec["skipped"][f"too_long:ewt:{split}"] == n_long
        assert rec["sentences"][split] == N_SENT - n_long
    assert sum(rec["skipped"][f"too_long:ewt:{s}"] for s in ("dev", "test")) > 0
    assert rec["frequency_source"].startswith("UD ewt:dev")


def test_forced_induction_head_on_repeated_random_tokens(tmp_path, capsys):
    tok = Tokenizer.train_bpe([" ".join(s.words) for s in ud_sentences("ewt", "dev")[:200]], vocab_size=400)
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=64, dropout=0.0)).eval()

    def induction(t, name):
        # sequence BOS + r + r of length 2T+1: position p >= T+1 attends to p - T + 1 (the token after
        # the earlier copy of its own token); earlier positions attend to BOS. Causal and row-stochastic.
        S = t.shape[-1]
        T = (S - 1) // 2
        P = torch.zeros(S, S)
        P[:, 0] = 1.0
        p = torch.arange(T + 1, S)
        P[p, 0] = 0.0
        P[p, p - T + 1] = 1.0
        t = t.clone()
        t[:, 1] = P
        return t

    cfg = HeadRunConfig(max_sentences=8, freq_source="ewt:dev", n_boot=20, similarity_max_words=100,
                        induction_sequences=2, induction_length=8)
    with model.hooks(fwd=[("blocks.1.attn.pattern", induction)]):
        t = analyse_loaded(model, tok, tmp_path / "out", cfg, model_name="dec", progress=True)
    # the bar counts every sentence scored: dev, test and the repeated random sequences
    n = json.loads((tmp_path / "out" / "heads_run.json").read_text())["sentences"]
    bars = [line for line in capsys.readouterr().err.splitlines() if " sent [" in line]
    total = n["dev"] + n["test"] + 2
    assert bars[-1].startswith(f"heads dec: 100% {total}/{total} sent ["), bars
    assert _score(t, 1, 1, "induction:repeated_random") == pytest.approx(1.0, abs=1e-3)
    assert _score(t, 0, 0, "induction:repeated_random") < 0.4
    c = t["heads_classes"]
    assert "induction" in set(c[(c.layer == 1) & (c["head"] == 1)]["role"])
    assert len(c[(c.layer == 1) & (c["head"] == 1) & c["primary"]]) == 1  # one primary role per head


def test_sentence_attention_matches_the_store_rows(tmp_path):
    import plmodels

    tok = Tokenizer.train_wordpiece(["the cat sat on the mat", "a dog ran"] * 5, vocab_size=60)
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=16, dropout=0.0))
    path = plmodels.save(model, tok, tmp_path / "m")
    attn, special = sentence_attention(path, ["the", "cat", "sat"])
    assert attn.shape == (2, 2, 3, 3) and special.shape == (2, 2, 3, 2)
    np.testing.assert_allclose(attn.sum(-1) + special.sum(-1), 1.0, atol=3e-3)
    with pytest.raises(ValueError, match="positions"):
        sentence_attention(path, ["cat"] * 20)


# ------------------------------------------------------------------ a planted syntactic head, end to end
N_TREE = 80


@pytest.fixture(scope="module")
def planted_syntax(tmp_path_factory):
    """An encoder whose block 1 head 0 is forced, on real EWT sentences, to attend from every token
    of each word to the first token of its UD head (the root word's tokens attend to themselves),
    then run through the whole path: model -> activation store -> HeadStats -> tables."""
    tmp = tmp_path_factory.mktemp("syntax")
    tok = word_vocab_tokenizer(tmp, N_TREE)
    trees = {}
    for split in ("dev", "test"):
        for s in ud_sentences("ewt", split)[:N_TREE]:
            enc = tok.encode_words(list(s.words))
            trees[tuple(enc.ids)] = (enc.word_spans, list(s.heads))
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=MAX_TREE_POS, dropout=0.0)).eval()
    seen: dict = {}

    def grab_ids(module, args, kwargs):
        seen["ids"] = (args[0] if args else kwargs["input_ids"]).tolist()

    def dependent_to_head(t, name):
        t = t.clone()
        for b, row in enumerate(seen["ids"]):
            key = tuple(i for i in row if i != tok.pad_id)
            if key not in trees:      # a sentence cut by the extraction: no tree to plant
                continue
            spans, heads = trees[key]
            P = torch.zeros(t.shape[-2:])
            P[torch.arange(len(key)), torch.arange(len(key))] = 1.0     # [CLS], [SEP], root: themselves
            for d, (a0, a1) in enumerate(spans):
                if heads[d] >= 0:
                    P[a0:a1] = 0.0
                    P[a0:a1, spans[heads[d]][0]] = 1.0
            t[b, 0] = P
        return t

    handle = model.register_forward_pre_hook(grab_ids, with_kwargs=True)
    try:
        with model.hooks(fwd=[("blocks.1.attn.pattern", dependent_to_head)]):
            run = HeadRunConfig(max_sentences=N_TREE, freq_source="ewt:dev", n_boot=20, similarity_max_words=100)
            tables = analyse_loaded(model, tok, tmp / "out", run, model_name="planted", progress=False)
    finally:
        handle.remove()
    return tables


def test_a_planted_dependent_to_head_head_is_found_syntactic_with_accuracy_one(planted_syntax):
    rel = planted_syntax["relations"]
    d2h = rel[(rel.direction == "dep2head") & (rel.n_test > 0) & (rel.n_dev > 0)]
    assert len(d2h) >= 10
    # every relation's best head, picked on dev, is the planted one, and it is right on every test case
    assert (d2h.best_layer == 1).all() and (d2h.best_head == 0).all(), d2h[["relation", "best_layer", "best_head"]]
    assert (d2h.test_acc == 1.0).all() and (d2h.dev_acc == 1.0).all()
    classes = planted_syntax["heads_classes"]
    planted = classes[(classes.layer == 1) & (classes["head"] == 0)]
    roles = set(planted["role"])
    for r in ("nsubj", "det", "case", "amod", "advmod"):
        assert f"syntactic:{r}" in roles, sorted(roles)
    assert planted[planted.primary]["role"].iloc[0].startswith("syntactic:")
    acc = planted_syntax["heads"]
    row = acc[(acc.layer == 1) & (acc["head"] == 0) & (acc.score == "syntactic_acc:det:dep2head")]
    assert float(row["value"].iloc[0]) == 1.0


# ---------------------------------------------------------------- floors and frequencies (issue 74)
def test_forced_head_beats_its_floors_which_are_stored_beside_its_score(forced):
    out, _, t = forced
    h = t["heads"].set_index(["layer", "head", "score"])
    row = h.loc[(1, 0, "positional_share:-1")]
    rec = json.loads((out / "heads_run.json").read_text())
    floors = rec["floors"]["raw"]
    assert set(floors) == {"uniform", "random_argmax", "random_init"}
    assert row["floor"] == pytest.approx(max(floors[s]["positional_share:-1"] for s in floors))
    assert row["floor_uniform"] == pytest.approx(floors["uniform"]["positional_share:-1"])
    assert row["ci_low"] > row["floor"] and row["ci_low"] <= row["value"] <= row["ci_high"]
    assert 0.0 <= rec["frequency_unknown_share"] < 0.05   # frequencies from the same dev words


def test_uniform_null_head_is_the_store_conversion_of_a_uniform_token_map(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat",
                                 "un", "##der", "##neath"]) + "\n")
    tok = Tokenizer.from_bert_vocab(vocab, lowercase=False)
    words = ["cats", "the", "underneath", "sat"]
    (pieces, special), = sentence_pieces(tok, [words])
    assert pieces.tolist() == [2, 1, 3, 1] and special.tolist() == [1, 1]
    enc = tok.encode_words(words)
    names, slots = special_token_columns(tok)
    T = len(enc.ids)
    tok_word = torch.full((1, T), -1)
    for w, (a, b) in enumerate(enc.word_spans):
        tok_word[0, a:b] = w
    slot = torch.tensor([[slots.get(t, -1) if tok_word[0, i] < 0 else -1 for i, t in enumerate(enc.ids)]])
    word, spec = word_attention_maps(torch.full((1, 1, T, T), 1.0 / T), tok_word, slot, len(words), len(names))
    null = null_heads(pieces, special, draws=0)
    np.testing.assert_allclose(null.attn[0, 0], word[0, 0].numpy(), atol=1e-7)
    np.testing.assert_allclose(null.special[0, 0], spec[0, 0].numpy(), atol=1e-7)
    assert int(null.attn[0, 0, 0].argmax()) == 2   # "underneath", the word with the most pieces


def test_ud_tokens_cut_text_as_the_treebank_does():
    assert ud_tokens("I don't know U.S. policy... it's 1,000.5 -- can't!!") == [
        "i", "do", "n't", "know", "u.s.", "policy", "...", "it", "'s", "1,000.5", "--", "ca", "n't", "!!"]


def test_ud_tokens_recover_the_gold_tokens_of_ewt_dev_text():
    from collections import Counter

    from workbench.data.tasks import UD_TREEBANKS
    texts, gold = [], []
    for line in UD_TREEBANKS["ewt"]("dev").read_text(encoding="utf-8").splitlines():
        if line.startswith("# text = "):
            texts.append(line[len("# text = "):])
    for s in ud_sentences("ewt", "dev"):
        gold.append(Counter(w.lower() for w in s.words))
    assert len(texts) == len(gold)
    found = sum(sum((Counter(ud_tokens(t)) & g).values()) for t, g in zip(texts, gold))
    assert found / sum(sum(g.values()) for g in gold) > 0.975   # measured 0.982; \\w+|[^\\w\\s]: 0.956
