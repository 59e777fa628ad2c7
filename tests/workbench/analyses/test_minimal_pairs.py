"""`workbench pairs`: the accuracy table with its four floors (a subset scorer's on its own items, by
hand), a planted model at 1.0, the frequency floor by hand, the score cache, the scorers an untrained
LM head leaves, and the CLI."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from plmodels import Decoder, DecoderConfig, Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from probes.ngram import BigramLM
from probes.sentence_scores import Scorer
from workbench.analyses import minimal_pairs as mp
from workbench.cli import main
from workbench.data.minimal_pairs import PairRecord
from workbench.data.pair_templates import INTRANSITIVE, NOUNS, OTHER_NOUNS
from workbench.presentation import views

CFG = {"suites": ["templates"], "max_pairs_per_condition": 6, "n_per_template": 24, "n_boot": 200}


def _texts() -> list[str]:
    nouns = " ".join(w for pair in NOUNS + OTHER_NOUNS for w in pair)
    return [f"The {nouns} near behind beside with that said ever No have has been himself themselves ."] * 30


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A text corpus in which only the singular verb forms occur (the frequency floor's planted answer)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    sing = " ".join(v[0] for v in INTRANSITIVE)
    path.write_text("\n\n".join(_texts()[:3] + [f"The author {sing} ."] * 5) + "\n", encoding="utf-8")
    return path


def _save(model, tok, folder, corpus, **card) -> str:
    plmodels.save(model, tok, folder, card={"data": {"train": [str(corpus), None]}, **card})
    return str(folder)


@pytest.fixture(scope="module")
def decoder_ckpt(tmp_path_factory, corpus):
    tok = Tokenizer.train_bpe(_texts(), vocab_size=300)
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32,
                                  max_positions=64)).eval()
    return _save(model, tok, tmp_path_factory.mktemp("dec") / "ckpt", corpus)


def test_the_table_holds_every_scorer_and_floor_with_intervals(decoder_ckpt, tmp_path):
    tables = mp.score_pairs_model(decoder_ckpt, tmp_path, CFG, progress=False)
    t = tables["minimal_pairs"]
    assert set(t["scorer"]) == {"clm", "floor:chance", "floor:frequency", "floor:bigram", "floor:random_init:clm"}
    assert set(t["phenomenon"]) == {"agreement_pp", "agreement_obj_rel", "agreement_sent_comp", "reflexive",
                                    "reflexive_obj_rel", "npi", "npi_obj_rel"}
    assert ((t["ci_low"] <= t["value"]) & (t["value"] <= t["ci_high"])).all()
    pooled = t[(t["condition"] == "all") & (t["scorer"] == "clm")].set_index("phenomenon")["n_items"]
    per = t[(t["condition"] != "all") & (t["scorer"] == "clm")].groupby("phenomenon")["n_items"].sum()
    assert pooled.sort_index().equals(per.sort_index())  # "all" pools the conditions
    chance = t[t["scorer"] == "floor:chance"]
    assert (chance["value"] == 0.5).all() and (chance["ci_low"] < 0.5).all() and (chance["ci_high"] > 0.5).all()
    items = tables["minimal_pair_items"]
    clm = items[items["scorer"] == "clm"]
    assert set(clm["correct"]) <= {0.0, 1.0} and (clm["correct"] == (clm["good"] > clm["bad"])).all()
    saved = pd.read_parquet(tmp_path / "tables" / "minimal_pairs.parquet")
    assert len(saved) == len(t) and json.loads((tmp_path / "minimal_pairs_run.json").read_text())["n_pairs"] > 0


def test_the_frequency_floor_chooses_the_form_the_corpus_holds(decoder_ckpt, tmp_path):
    """Only the singular verbs occur in the corpus: the floor wins every singular-subject agreement pair
    and loses every plural one."""
    t = mp.score_pairs_model(decoder_ckpt, None, {**CFG, "floors": ["frequency"]}, progress=False)["minimal_pairs"]
    agr = t[(t["scorer"] == "floor:frequency") & (t["phenomenon"] == "agreement_pp") & (t["condition"] != "all")]
    values = dict(zip(agr["condition"], agr["value"]))
    assert values == {"sing_match": 1.0, "sing_mismatch": 1.0, "plur_match": 0.0, "plur_mismatch": 0.0}


def test_a_planted_model_scores_one_on_every_phenomenon(decoder_ckpt, monkeypatch):
    """A hook on the decoder's output that makes the grammatical sentences' next tokens certain."""
    model, tok = plmodels.load(decoder_ckpt)
    good = [tok.encode_words(list(r.good)).ids for r in mp.select_pairs(mp.PairsRunConfig.resolve(CFG))]
    prefixes: dict[tuple, set] = {}
    for g in good:
        for t in range(1, len(g)):
            prefixes.setdefault(tuple(g[:t]), set()).add(g[t])

    def plant(module, args, out):
        ids = args[0].tolist()
        logits = torch.zeros_like(out.logits)
        for b, row in enumerate(ids):
            for t in range(len(row)):
                nxt = prefixes.get(tuple(row[: t + 1]))
                if nxt:
                    logits[b, t] = -1e4
                    logits[b, t, sorted(nxt)] = 0.0
        out.logits = logits
        return out

    model.register_forward_hook(plant)
    monkeypatch.setattr(mp.plmodels, "load", lambda path: (model, tok))
    t = mp.score_pairs_model(decoder_ckpt, None, {**CFG, "floors": ["chance"]}, progress=False)["minimal_pairs"]
    assert (t.loc[t["scorer"] == "clm", "value"] == 1.0).all()


def test_scores_are_cached_per_checkpoint_and_suite_version(decoder_ckpt, tmp_path, monkeypatch):
    cfg = {**CFG, "floors": ["chance"]}
    first = mp.score_pairs_model(decoder_ckpt, tmp_path, cfg, progress=False)["minimal_pair_items"]
    def refuse(*args, **kwargs):
        raise AssertionError("not cached")

    monkeypatch.setattr(Scorer, "score_pairs", refuse)
    again = mp.score_pairs_model(decoder_ckpt, tmp_path, cfg, progress=False)["minimal_pair_items"]
    pd.testing.assert_frame_equal(first, again)
    monkeypatch.setattr(mp, "SUITE_VERSION", "another")
    with pytest.raises(AssertionError, match="not cached"):
        mp.score_pairs_model(decoder_ckpt, tmp_path, cfg, progress=False)


def test_an_untrained_mlm_head_leaves_only_the_rtd_scorer(tmp_path, corpus):
    tok = Tokenizer.train_wordpiece(_texts(), vocab_size=200)
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                  max_positions=64, use_rtd=True)).eval()
    electra = _save(model, tok, tmp_path / "electra", corpus, objective_name="electra")
    mlm = _save(model, tok, tmp_path / "mlm", corpus, objective_name="mlm")
    assert not mp.lm_head_trained(electra) and mp.lm_head_trained(mlm)
    t = mp.score_pairs_model(electra, None, {**CFG, "floors": ["chance"]}, progress=False)["minimal_pairs"]
    assert set(t["scorer"]) == {"rtd", "floor:chance"}


def test_the_bigram_floor_is_witten_bell_by_hand():
    lm = BigramLM(4).fit(np.array([0, 1, 0, 1, 0, 2]))
    # context 0: c(0) = 3, followers {1, 2}: T = 2; p_uni(1) = (2 + 1) / (6 + 4)
    assert np.exp(lm.logprob([0, 1])[0]) == pytest.approx((2 + 2 * 0.3) / (3 + 2))
    assert np.exp(lm.logprob([3, 1])[0]) == pytest.approx(0.3)  # unseen context: the unigram
    p = np.exp([lm.logprob([0, b])[0] for b in range(4)])
    assert p.sum() == pytest.approx(1.0)


def test_the_cli_names_a_bad_floor_in_one_line(decoder_ckpt, tmp_path, capsys):
    assert main(["pairs", decoder_ckpt, "--out", str(tmp_path), "--set", 'floors=["coin"]']) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "floors" in err[0] and "coin" in err[0]


def test_the_scorers_field_keeps_the_named_scorers_that_apply(decoder_ckpt, tmp_path):
    """A study names the scorers of every kind at once: each model keeps those of its kind; a model none
    applies to is refused naming them, and an unknown name is refused before any work."""
    cfg = {**CFG, "floors": ["chance"], "scorers": ["masked_word", "clm"]}
    t = mp.score_pairs_model(decoder_ckpt, None, cfg, progress=False)["minimal_pairs"]
    assert set(t["scorer"]) == {"clm", "floor:chance"}
    with pytest.raises(ValueError, match=r"none of scorers=\['masked_word'\] applies to this decoder"):
        mp.score_pairs_model(decoder_ckpt, None, {**cfg, "scorers": ["masked_word"]}, progress=False)
    with pytest.raises(ValueError, match="PairsRunConfig.scorers: \\['plm'\\]"):
        mp.PairsRunConfig.resolve({"scorers": ["plm"]})


def test_items_carry_their_cell_and_a_shared_cache_is_used(decoder_ckpt, tmp_path):
    cfg = {**CFG, "floors": ["chance"]}
    items = mp.score_pairs_model(decoder_ckpt, tmp_path / "out", cfg, progress=False,
                                 cache_dir=tmp_path / "shared")["minimal_pair_items"]
    pairs = {r.id: r for r in mp.select_pairs(mp.PairsRunConfig.resolve(cfg), tmp_path / "shared")}
    assert all((r.suite, r.phenomenon, r.condition, r.variant) == (pairs[r.id].suite, pairs[r.id].phenomenon,
                                                                   pairs[r.id].condition, pairs[r.id].variant)
               for r in items.itertuples())
    assert list((tmp_path / "shared").glob("*.npy")) and not (tmp_path / "out" / "cache").exists()


def test_a_long_document_encodes_in_pieces_to_the_same_ids():
    """The corpus floors encode a book in pieces cut after a newline between two non-space characters:
    the ids are those of the whole text, also where a cut elsewhere (before indented lines, after
    trailing spaces) would change byte-level BPE's pre-tokens."""
    rng = np.random.default_rng(0)
    words = ["the", "author", "laughs", "guards", "near", "No", "ever", ",", "."]
    lines = [" ".join(rng.choice(words, rng.integers(1, 8))) for _ in range(400)]
    seps = ["\n", "\n\n", "\n  ", " \n", "\n\t", "\r\n", "\n \n"]
    text = "".join(line + seps[i % len(seps)] for i, line in enumerate(lines))
    for tok in (Tokenizer.train_bpe([text], vocab_size=300), Tokenizer.train_wordpiece([text], vocab_size=120)):
        whole = tok.encode(text, add_special=False)
        assert mp.encode_long(tok, text, chunk_chars=200) == whole
        assert len(mp.CUT.findall(text)) > len(text) // 200     # the text is cut in many pieces


def test_the_random_init_floor_is_cached_by_architecture_not_by_weights(decoder_ckpt, corpus, tmp_path, monkeypatch):
    """A second checkpoint of the same architecture and tokenizer (other weights: another seed of a zoo
    system, a later step) reads the random-init floor from the cache and scores only itself; the floor
    is the one a fresh computation gives. Another init seed is scored anew."""
    cfg = {**CFG, "floors": ["random_init"]}
    model, tok = plmodels.load(decoder_ckpt)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1)
    other = _save(model, tok, tmp_path / "other", corpus)
    first = mp.score_pairs_model(decoder_ckpt, tmp_path / "a", cfg, progress=False, cache_dir=tmp_path / "c")
    calls = []
    score = Scorer.score_pairs
    monkeypatch.setattr(Scorer, "score_pairs", lambda self, m, *a: calls.append(m) or score(self, m, *a))
    second = mp.score_pairs_model(other, tmp_path / "b", cfg, progress=False, cache_dir=tmp_path / "c")
    assert len(calls) == 1 and calls[0].training is False               # the trained model only
    floor = lambda t: t["minimal_pair_items"].query("scorer == 'floor:random_init:clm'")[["good", "bad"]]  # noqa: E731
    np.testing.assert_array_equal(floor(first).to_numpy(), floor(second).to_numpy())
    own = lambda t: t["minimal_pair_items"].query("scorer == 'clm'")["good"].to_numpy()  # noqa: E731
    assert not np.array_equal(own(first), own(second))
    fresh = mp.score_pairs_model(other, None, cfg, progress=False)        # no cache: computed again
    np.testing.assert_array_equal(floor(fresh).to_numpy(), floor(second).to_numpy())
    mp.score_pairs_model(other, tmp_path / "b", {**cfg, "seed": 1}, progress=False, cache_dir=tmp_path / "c")
    assert len(calls) == 1 + 2 + 2                                      # another seed: model and floor anew


def _subset_table() -> pd.DataFrame:
    """Six pairs of one phenomenon by hand: clm scores all, masked_word only pairs 0-3 (4 and 5 are
    multi-piece contrasts it leaves out); the frequency floor wins pairs 0-2, the bigram floor 3-5."""
    pairs = [PairRecord(f"p{i}", "templates", "agreement_pp", "c", "template", ("a", "b"), ("a", "c"), 1, 1, 0, "hand", 0)
             for i in range(6)]

    def scores(won: list[float]) -> np.ndarray:   # 1 -> good wins, 0 -> bad wins, NaN -> unscored
        return np.stack([np.asarray(won, float), np.where(np.isnan(won), np.nan, 0.5)], axis=1)

    subset = [1, 1, 0, 1, np.nan, np.nan]
    items = pd.concat([mp._items("m", pairs, "clm", scores([1, 1, 1, 1, 0, 0])),
                       mp._items("m", pairs, "masked_word", scores(subset)),
                       mp._items("m", pairs, "floor:random_init:masked_word", scores([0, 1, 0, 0, np.nan, np.nan])),
                       mp._items("m", pairs, "floor:chance", np.zeros((6, 2))),
                       mp._items("m", pairs, "floor:frequency", scores([1, 1, 1, 0, 0, 0])),
                       mp._items("m", pairs, "floor:bigram", scores([0, 0, 0, 1, 1, 1]))], ignore_index=True)
    return mp.accuracy_rows(items, pairs, "m", mp.PairsRunConfig(n_boot=50))


def test_a_subset_scorer_gets_its_floors_on_its_own_items():
    t = _subset_table()
    t = t[t["condition"] == "all"].set_index("scorer")
    # pooled over the six items: frequency 3/6, bigram 3/6; on masked_word's four: 3/4 and 1/4 (by hand)
    assert t.loc["floor:frequency", "value"] == 0.5 and t.loc["floor:bigram", "value"] == 0.5
    assert t.loc["floor:frequency:masked_word", "value"] == 0.75
    assert t.loc["floor:bigram:masked_word", "value"] == 0.25
    assert t.loc["floor:chance:masked_word", "value"] == 0.5
    assert t.loc["floor:chance:masked_word", "ci_high"] == 1.0 > t.loc["floor:chance", "ci_high"]  # a coin over 4
    for floor in ("chance", "frequency", "bigram", "random_init"):
        assert t.loc[f"floor:{floor}:masked_word", "n_items"] == t.loc["masked_word", "n_items"] == 4
    assert not any(s.endswith(":clm") for s in t.index)   # clm scores every item: the pooled floors are its own


def test_the_summary_puts_each_scorer_beside_the_floors_on_its_own_items():
    s = views.pairs_summary_frame(_subset_table()).set_index("scorer")
    acc = views.pairs_accuracy_frame(_subset_table())
    for scorer, r in s.iterrows():   # every floor the summary picked stands on the scorer's n_items
        own = acc[(acc["source"] != "model") & (acc["scorer"] == scorer)]
        floors = own if len(own) else acc[(acc["source"] != "model") & (acc["scorer"] == "")]
        assert (floors["n_items"] == r["n_items"]).all()
    assert s.loc["masked_word", "frequency"] == 0.75 and s.loc["masked_word", "bigram"] == 0.25
    assert s.loc["masked_word", "chance"] == 1.0          # the upper end of a coin's range over 4 items
    assert s.loc["clm", "frequency"] == 0.5 and s.loc["clm", "bigram"] == 0.5
