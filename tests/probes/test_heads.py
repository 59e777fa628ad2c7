"""Head roles on hand-made attention maps whose every score is known exactly."""

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest

from probes.heads import (FLOOR_SOURCES, HEAD_COLUMNS, HeadConfig, HeadStats, Sentence, best_heads_per_relation, bootstrap_ratio,
                          combine_floors, floor_scores, null_heads, relation_base)

CFG = HeadConfig(syntactic_min_count=1)


def onehot_attn(targets: np.ndarray, n_special: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """targets (H, n) word index per row -> attn (1, H, n, n) one-hot, special zeros (1, H, n, k)."""
    H, n = targets.shape
    attn = np.zeros((1, H, n, n))
    attn[0, np.arange(H)[:, None], np.arange(n)[None, :], targets] = 1.0
    return attn, np.zeros((1, H, n, n_special))


def test_config_round_trips_and_rejects_unknown_keys_and_wrong_types():
    assert HeadConfig.from_dict(json.loads(json.dumps(HeadConfig().to_dict()))) == HeadConfig()
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        HeadConfig.from_dict({"positional": 0.9, "bogus": 1})
    with pytest.raises(ValueError, match=r"heads.json: positional_window: input should be a valid integer, got 2.5"):
        HeadConfig.from_dict({"positional_window": 2.5}, "heads.json")
    with pytest.raises(ValueError, match="positional"):
        HeadConfig(positional=1.5)


def test_previous_and_self_heads_are_positional_with_share_one():
    st = HeadStats(CFG)
    for n in (3, 5, 8):
        i = np.arange(n)
        prev = np.where(i > 0, i - 1, 0)           # word 0 has no left neighbour: looks at itself
        nxt = np.where(i < n - 1, i + 1, n - 1)
        attn, spec = onehot_attn(np.stack([prev, i, nxt]))
        st.update(Sentence(attn, spec))
    sc = st.score_arrays()
    assert sc["positional_share:-1"][0].tolist() == [1.0, 0.0, 0.0]
    assert sc["positional_share:self"][0, 1] == 1.0
    assert sc["positional_share:+1"][0, 2] == 1.0
    # previous-token score is the mean attention on i-1 over words i >= 1
    assert sc["previous_token"][0, 0] == 1.0 and sc["previous_token"][0, 1] == 0.0
    roles, primary = st.roles()
    assert "positional:-1" in roles[0] and "previous_token" in roles[0]
    assert primary == ["positional:-1", "positional:self", "positional:+1"]
    assert sc["confidence"][0].tolist() == [1.0, 1.0, 1.0]
    assert np.allclose(sc["entropy"], 0.0)


def tree_sentence(heads, deprels, targets_fn):
    heads = np.asarray(heads)
    n = len(heads)
    tg = targets_fn(heads, np.asarray(deprels))
    attn, spec = onehot_attn(tg)
    return Sentence(attn, spec, heads=heads, deprels=deprels)


def test_dependent_to_head_head_gets_det_accuracy_one_and_beats_offset_baseline():
    # det offsets differ (+1, +2, +3) so no fixed offset reaches accuracy 1
    corpus = [([1, -1], ["det", "root"]),
              ([2, 2, -1], ["det", "amod", "root"]),
              ([3, 3, 3, -1, 3], ["det", "amod", "amod", "root", "punct"]),
              ([1, -1, 3, 1], ["det", "root", "det", "obj"])]
    dep2head = lambda h, d: np.stack([np.where(h >= 0, h, np.arange(len(h))),     # head 0: to its head
                                      np.arange(len(h))])                          # head 1: self
    st = HeadStats(CFG)
    for heads, rels in corpus:
        st.update(tree_sentence(heads, rels, dep2head))
    sc = st.score_arrays()
    off, base = st.baseline()
    ri = CFG.relations.index("det")
    assert sc["syntactic_acc:det:dep2head"][0, 0] == 1.0
    assert off[0, ri] == 1 and base[0, ri] == pytest.approx(3 / 5)   # offset +1 right for 3 of 5 dets
    assert sc["syntactic_margin:det:dep2head"][0, 0] == pytest.approx(2 / 5)
    # head 1 looks only at itself: with the diagonal excluded (Clark et al.'s code) every other weight
    # is 0 and the tie rule picks the lowest other word, which is the head of 2 of the 5 dets
    assert sc["syntactic_acc:det:dep2head"][0, 1] == pytest.approx(2 / 5)
    roles, primary = st.roles()
    assert "syntactic:det" in roles[0] and "syntactic:det" not in roles[1]
    assert primary[0].startswith("syntactic:")


def _one_head(rows) -> tuple[np.ndarray, np.ndarray]:
    attn = np.asarray(rows, dtype=np.float32)[None, None]        # (1, 1, n, n)
    return attn, np.zeros(attn.shape[:-1] + (2,), np.float32)


def test_the_syntactic_argmax_excludes_the_word_itself_as_clarks_code_does():
    # every word keeps 0.6 on itself and gives 0.4 to its head: Clark's predictor (diagonal zeroed)
    # attaches each det to its head; the argmax over the full row would pick the word itself
    heads, rels = np.array([1, -1, 3, 1]), ["det", "root", "det", "obj"]
    rows = np.eye(4) * 0.6
    for d, h in enumerate(heads):
        rows[d, h if h >= 0 else d] += 0.4
    sent = Sentence(*_one_head(rows), heads=heads, deprels=rels)
    clark = HeadStats(CFG).update(sent).score_arrays()
    variant = HeadStats(replace(CFG, syntactic_exclude_self=False)).update(sent).score_arrays()
    assert clark["syntactic_acc:det:dep2head"][0, 0] == 1.0
    assert variant["syntactic_acc:det:dep2head"][0, 0] == 0.0


def test_head_to_dependent_scores_the_transposed_map_per_dependent():
    # Clark's "transpose" mode: for each dependent d, is the word that attends most to d its head?
    # word 2 heads two amod dependents (0 and 1) and attends to 0 only; word 0 attends to word 1.
    heads, rels = np.array([2, 2, -1]), ["amod", "amod", "root"]
    rows = [[0.2, 0.8, 0.0],    # word 0 -> word 1
            [0.0, 1.0, 0.0],    # word 1 -> itself
            [1.0, 0.0, 0.0]]    # word 2 -> its dependent 0
    st = HeadStats(CFG).update(Sentence(*_one_head(rows), heads=heads, deprels=rels))
    ri = CFG.relations.index("amod")
    # column 0: word 2 attends most to it (its head, right); column 1: word 0 does (wrong). Counting
    # per head word whether its argmax is "any dependent" would say 1/1 here.
    assert st.score_arrays()["syntactic_acc:amod:head2dep"][0, 0] == 0.5
    assert st.syn_count_[1, ri] == 2 and st.syn_count_[0, ri] == 2      # one case per dependent
    # both directions predict each dependent's head, so they share one offset baseline
    assert np.array_equal(st.base_hits_[0], st.base_hits_[1])


def test_head_to_dependent_argmax_excludes_the_diagonal():
    # issue 75: word 0 (an amod dependent of word 1) attends to itself most, and word 1 attends to
    # it too. Column 0's largest entry is the diagonal; the word attending most to word 0 *other
    # than itself* is word 1, its head. Keeping the diagonal picks word 0 itself: accuracy 0.
    heads, rels = np.array([1, -1, 1]), ["amod", "root", "punct"]
    rows = [[1.0, 0.0, 0.0],    # word 0 -> itself
            [0.6, 0.4, 0.0],    # word 1 -> its dependent 0
            [0.0, 1.0, 0.0]]    # word 2 -> word 1
    sent = Sentence(*_one_head(rows), heads=heads, deprels=rels)
    assert HeadStats(CFG).update(sent).score_arrays()["syntactic_acc:amod:head2dep"][0, 0] == 1.0
    variant = HeadStats(replace(CFG, syntactic_exclude_self=False)).update(sent).score_arrays()
    assert variant["syntactic_acc:amod:head2dep"][0, 0] == 0.0


def test_confidence_is_over_words_not_special_tokens():
    # Voita et al. 2019: the head's largest weight excluding the end-of-sentence symbol; a head that
    # parks 0.9 on [SEP] is not confident about any word
    attn = np.full((1, 1, 3, 3), 0.1 / 3, np.float32)
    special = np.zeros((1, 1, 3, 2), np.float32)
    special[..., 1] = 0.9
    sc = HeadStats(CFG).update(Sentence(attn, special)).score_arrays()
    assert sc["confidence"][0, 0] == pytest.approx(0.1 / 3)
    assert sc["confidence_full_row"][0, 0] == pytest.approx(0.9)


def test_relation_base_keeps_nmod_poss_only():
    assert relation_base("obl:tmod") == "obl"
    assert relation_base("nmod:poss") == "nmod:poss"
    assert relation_base("compound:prt") == "compound"


def test_rare_token_head_and_tied_sentences_skipped():
    st = HeadStats(CFG)
    freqs = [np.array([5, 1, 9, 7]), np.array([3, 8, 2]), np.array([4, 4, 4])]
    for f in freqs:
        n = len(f)
        attn, spec = onehot_attn(np.stack([np.full(n, f.argmin()), np.arange(n)]))
        st.update(Sentence(attn, spec, freqs=f))
    sc = st.score_arrays()
    assert sc["rare_token"][0, 0] == 1.0
    assert sc["rare_token"][0, 1] == pytest.approx(2 / 7)   # self-attention hits the rare word once each
    assert st.skipped_["rare_token:all_tied"] == 1
    roles, _ = st.roles()
    assert "rare_token" in roles[0] and "rare_token" not in roles[1]


def test_rare_token_ties_credit_one_over_k_by_hand():
    # sentence 1: words 1 and 2 tie as the rarest (k = 2); sentence 2: word 0 alone is the rarest
    st = HeadStats(CFG)
    for f, to in ((np.array([4, 1, 1, 9]), 1), (np.array([1, 3, 3]), 0)):
        n = len(f)
        attn, spec = onehot_attn(np.stack([np.full(n, to), np.full(n, n - 1)]))
        st.update(Sentence(attn, spec, freqs=f))
    sc = st.score_arrays()
    # head 0: 4 words x 1/2 + 3 words x 1 over 7 words; head 1 points at a non-rarest word both times
    assert sc["rare_token"][0, 0] == pytest.approx((4 * 0.5 + 3 * 1.0) / 7)
    assert sc["rare_token"][0, 1] == 0.0


def test_frequency_dict_lookup_matches_explicit_freqs():
    attn, spec = onehot_attn(np.array([[2, 2, 2]]))
    a = HeadStats(CFG, freq={"the": 100, "cat": 5}).update(Sentence(attn, spec, words=["the", "cat", "zyx"]))
    assert a.score_arrays()["rare_token"][0, 0] == 1.0   # unseen "zyx" has frequency 0


def test_cls_sep_punct_and_self_shares_by_hand():
    st = HeadStats(CFG)
    # sentence 1: n=2, every row 0.6 [CLS], 0.1 [SEP], 0.3 on word 1 (a punctuation mark)
    a1 = np.zeros((1, 1, 2, 2)); a1[..., 1] = 0.3
    s1 = np.zeros((1, 1, 2, 2)); s1[..., 0], s1[..., 1] = 0.6, 0.1
    st.update(Sentence(a1, s1, punct=np.array([False, True])))
    # sentence 2: n=3, rows 0.2 [CLS], 0.5 [SEP], 0.3 on self; no punctuation
    a2 = np.eye(3)[None, None] * 0.3
    s2 = np.zeros((1, 1, 3, 2)); s2[..., 0], s2[..., 1] = 0.2, 0.5
    st.update(Sentence(a2, s2, upos=["NOUN", "VERB", "NOUN"]))
    sc = st.score_arrays()
    assert sc["attn_to_cls"][0, 0] == pytest.approx((2 * 0.6 + 3 * 0.2) / 5)
    assert sc["attn_to_sep"][0, 0] == pytest.approx((2 * 0.1 + 3 * 0.5) / 5)
    assert sc["attn_to_punct"][0, 0] == pytest.approx(2 * 0.3 / 5)
    assert sc["attn_to_self"][0, 0] == pytest.approx((0.3 + 3 * 0.3) / 5)
    assert sc["confidence"][0, 0] == pytest.approx(0.3)                    # largest weight on a word
    assert sc["confidence_full_row"][0, 0] == pytest.approx((2 * 0.6 + 3 * 0.5) / 5)
    roles, _ = HeadStats(CFG).update(Sentence(a1, s1)).roles()
    assert "cls_sink" in roles[0] and "sep_sink" not in roles[0]


def test_entropy_of_uniform_row_is_log_n_and_head_is_broad():
    n = 6
    st = HeadStats(CFG, special_names=()).update(Sentence(np.full((1, 1, n, n), 1 / n)))
    sc = st.score_arrays()
    assert sc["entropy"][0, 0] == pytest.approx(np.log(n), rel=1e-6)
    assert sc["entropy_normalized"][0, 0] == pytest.approx(1.0, rel=1e-6)
    assert st.roles()[0][0] == ["broad"]


def test_causal_uniform_rows_are_normalized_by_their_own_support():
    n = 5
    attn = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    st = HeadStats(CFG, special_names=()).update(Sentence(attn[None, None]))
    sc = st.score_arrays()
    assert sc["entropy"][0, 0] == pytest.approx(np.mean(np.log(np.arange(1, n + 1))), rel=1e-6)
    assert sc["entropy_normalized"][0, 0] == pytest.approx(1.0, rel=1e-6)  # row 0 (support 1) skipped


def test_induction_head_on_repeated_random_sequence():
    rng = np.random.default_rng(0)
    T = 7
    seq = rng.permutation(50)[:T]
    words = np.concatenate([seq, seq])
    n = 2 * T
    i = np.arange(n)
    induction = np.where(i >= T, i - T + 1, 0)   # second copy: look at the token after the first copy
    prev = np.maximum(i - 1, 0)
    attn, spec = onehot_attn(np.stack([induction, prev]), n_special=1)
    st = HeadStats(CFG, special_names=("bos",)).update(Sentence(attn, spec, words=words))
    sc = st.score_arrays()
    assert st.n_ind_ == T   # every word of the second copy has an earlier copy at i - T
    assert sc["induction"][0].tolist() == [1.0, 0.0]
    roles, primary = st.roles()
    assert primary[0] == "induction" and "previous_token" in roles[1]


def test_rows_not_summing_to_one_raise_naming_sentence_layer_and_head():
    st = HeadStats(CFG)
    attn, spec = onehot_attn(np.array([[0, 0], [1, 1]]))
    st.update(Sentence(attn, spec))
    bad = np.concatenate([attn, attn], axis=0)   # 2 layers
    bad[1, 1, 0] *= 0.5
    with pytest.raises(ValueError, match=r"sentence 1 \(s-bad\).*word 0 in layer 1, head 1"):
        st.update(Sentence(bad, np.zeros((2, 2, 2, 2)), sid="s-bad"))
    nan = attn.copy(); nan[0, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="layer 0, head 0"):
        HeadStats(CFG).update(Sentence(nan, spec))
    with pytest.raises(ValueError, match="heads"):
        HeadStats(CFG).update(Sentence(attn, spec, heads=np.array([0, -1]), deprels=["det", "root"]))


def test_missing_relation_reports_count_zero_with_a_warning():
    sent = tree_sentence([1, -1], ["det", "root"], lambda h, d: np.stack([np.array([1, 1])]))
    with pytest.warns(UserWarning, match="iobj"):
        df = best_heads_per_relation([sent], [sent], config=CFG, n_boot=50)
    row = df[(df.relation == "iobj") & (df.direction == "dep2head")].iloc[0]
    assert row.n_dev == 0 and row.n_test == 0 and np.isnan(row.test_acc) and row.best_head == -1
    det = df[(df.relation == "det") & (df.direction == "dep2head")].iloc[0]
    assert det.test_acc == 1.0 and det.n_test == 1


def selection_corpus(acc_a: float, acc_b: float, n_sent: int, seed: int) -> list[Sentence]:
    """[det, noun, punct]; the det attends to its noun in head 0 with prob acc_a, in head 1 with prob
    acc_b, else to the punctuation mark (a wrong *other* word: the syntactic argmax excludes self)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sent):
        hits = rng.random(2) < [acc_a, acc_b]
        tg = np.array([[1 if hits[0] else 2, 1, 1], [1 if hits[1] else 2, 1, 1]])
        attn, spec = onehot_attn(tg)
        out.append(Sentence(attn, spec, heads=np.array([1, -1, 1]), deprels=["det", "root", "punct"]))
    return out


def test_best_head_is_picked_on_dev_and_reported_on_test():
    dev = selection_corpus(1.0, 0.8, 200, seed=1)    # head 0 best on dev
    test = selection_corpus(0.5, 1.0, 200, seed=2)   # head 1 best on test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = best_heads_per_relation(dev, test, model="m", config=CFG, n_boot=200, seed=0)
    row = df[(df.relation == "det") & (df.direction == "dep2head")].iloc[0]
    assert (row.best_layer, row.best_head) == (0, 0)
    assert row.dev_acc == 1.0
    test_hits = sum(s.attn[0, 0, 0].argmax() == 1 for s in test)
    assert row.test_acc == pytest.approx(test_hits / 200)     # head 0's test accuracy, not head 1's 1.0
    assert row.ci_low <= row.test_acc <= row.ci_high
    assert row.baseline_offset == 1 and row.baseline_acc == 1.0
    assert list(df.columns[:11]) == ["model", "relation", "direction", "best_layer", "best_head", "dev_acc",
                                     "test_acc", "ci_low", "ci_high", "baseline_offset", "baseline_acc"]


def test_bootstrap_ci_contains_estimate_and_shrinks_with_more_data():
    rng = np.random.default_rng(0)
    widths = []
    for S in (50, 800):
        counts = rng.integers(1, 6, size=(S, 1)).astype(float)
        hits = rng.binomial(counts.astype(int), 0.7).astype(float)
        lo, hi = bootstrap_ratio(hits, counts, n_boot=500, seed=3)
        est = hits.sum() / counts.sum()
        assert lo[0] <= est <= hi[0]
        widths.append(hi[0] - lo[0])
    assert widths[1] < widths[0] / 2   # ~ 1/sqrt(16) = 1/4 expected
    again = bootstrap_ratio(hits, counts, n_boot=500, seed=3)
    assert again[0][0] == lo[0]   # seeded


def test_finalize_tables_follow_the_schema():
    st = HeadStats(CFG)
    attn, spec = onehot_attn(np.array([[0, 0, 1], [0, 1, 2]]))
    st.update(Sentence(np.concatenate([attn, attn]), np.concatenate([spec, spec])))
    rep = st.finalize("tiny")
    assert list(rep.heads.columns) == ["model", "layer", "head", "score", "value", "floor",
                                       *[f"floor_{src}" for src in FLOOR_SOURCES], "ci_low", "ci_high"] == HEAD_COLUMNS
    assert rep.heads["floor"].isna().all()   # no floor sources given: thresholds alone
    assert list(rep.classes.columns) == ["model", "layer", "head", "role", "primary"]
    assert set(zip(rep.heads["layer"], rep.heads["head"])) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert rep.classes.groupby(["layer", "head"]).primary.sum().eq(1).all()   # one primary per head
    v = rep.heads.set_index(["layer", "head", "score"]).value
    assert v[(1, 1, "positional_share:self")] == 1.0


def test_update_is_vectorised_over_layers_and_heads():
    rng = np.random.default_rng(0)
    sents = []
    for _ in range(300):
        n = int(rng.integers(8, 25))
        p = np.exp(rng.normal(size=(6, 12, n, n + 2)) * 3).astype(np.float32)
        p /= p.sum(-1, keepdims=True)
        sents.append(Sentence(p[..., :n], p[..., n:], heads=np.r_[-1, rng.integers(0, np.arange(1, n))],
                              deprels=["root"] + ["det"] * (n - 1), freqs=rng.integers(1, 50, n),
                              words=rng.integers(0, 10, n), punct=rng.random(n) < 0.1))
    st = HeadStats(CFG)
    for s in sents:
        st.update(s)
    with pytest.warns(UserWarning, match="absent from the corpus"):   # only det is annotated
        st.finalize("m")
    assert st.n_words_ == sum(s.attn.shape[-1] for s in sents)
    # one update for all 72 heads scores each head as it would be scored alone: no axis mixed up
    full = st.score_arrays()
    for l, h in ((0, 0), (2, 7), (5, 11)):
        alone = HeadStats(CFG)
        for s in sents:
            alone.update(Sentence(s.attn[l:l + 1, h:h + 1], s.special[l:l + 1, h:h + 1], heads=s.heads,
                                  deprels=s.deprels, freqs=s.freqs, words=s.words, punct=s.punct))
        one = alone.score_arrays()
        assert one.keys() == full.keys()
        for k in full:
            np.testing.assert_allclose(full[k][l, h], one[k][0, 0], rtol=1e-6, atol=1e-9, err_msg=k)  # float32 sums


# ---------------------------------------------------------------- floors (issue 74)
def _corpus(n_sent: int = 120, seed: int = 0, ties: bool = True):
    """Sentences where the rarest word is also the longest in pieces (the length bias a uniform head
    turns into rare-token share), with ties among the rarest in a third of them; UD-style trees."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_sent):
        n = int(rng.integers(5, 12))
        f = rng.integers(5, 1000, n).astype(float)
        rare = rng.choice(n, size=2 if ties and k % 3 == 0 else 1, replace=False)
        f[rare] = 1.0
        pieces = np.where(f == 1.0, 3, rng.choice([1, 2, 3], n, p=[0.6, 0.3, 0.1]))  # rare words: 3 pieces
        heads = np.r_[-1, rng.integers(0, np.arange(1, n))]
        deprels = ["root"] + list(rng.choice(["det", "amod", "nsubj", "obj", "case"], n - 1))
        s = Sentence(np.full((1, 1, n, n), 1.0 / n, np.float32), np.zeros((1, 1, n, 2), np.float32), heads=heads,
                     deprels=deprels, upos=["PUNCT" if i == n - 1 else "NOUN" for i in range(n)], freqs=f,
                     words=[f"w{i}" for i in range(n)], sid=str(k))
        out.append((s, pieces))
    return out


def _floors_of(corpus, draws=8):
    st = HeadStats(CFG, keep_per_sentence=True)
    for s, pieces in corpus:
        st.update(null_heads(pieces, [1, 1], draws=draws, seed=int(s.sid), heads=s.heads, deprels=s.deprels,
                             upos=s.upos, freqs=s.freqs, words=s.words))
    uni = np.zeros((1, 1 + draws), bool)
    uni[0, 0] = True
    return st, {"uniform": floor_scores(st, uni), "random_argmax": floor_scores(st, ~uni, "mean")}


@pytest.mark.filterwarnings("ignore:HeadStats. relations absent")
def test_planted_rarest_word_head_is_rare_token_with_share_one_beside_its_floor():
    corpus = _corpus(ties=False)   # with k tied rarest words a planted head earns 1/k, not 1
    _, sources = _floors_of(corpus)
    st = HeadStats(CFG, keep_per_sentence=True)
    for s, _ in corpus:
        n = s.attn.shape[-1]
        attn, spec = onehot_attn(np.stack([np.full(n, int(np.argmin(s.freqs))), np.arange(n)]))
        st.update(Sentence(attn, spec, heads=s.heads, deprels=s.deprels, upos=s.upos, freqs=s.freqs, words=s.words))
    rep = st.finalize("m", floor_sources=sources, n_boot=200)
    v = rep.heads[rep.heads["score"] == "rare_token"].set_index("head")
    assert v.loc[0, "value"] == 1.0 and v.loc[0, "floor"] == pytest.approx(sources["uniform"]["rare_token"])
    assert v.loc[0, "floor"] > CFG.rare_token       # the uniform head alone would pass the old threshold
    assert v.loc[0, "ci_low"] > v.loc[0, "floor"]
    roles = rep.classes.groupby("head")["role"].apply(set)
    assert "rare_token" in roles[0] and "rare_token" not in roles[1]


@pytest.mark.filterwarnings("ignore:HeadStats. relations absent")
def test_uniform_head_is_not_rare_token_at_any_length_bias_and_null_heads_get_no_role_but_broad():
    corpus = _corpus()
    st, sources = _floors_of(corpus)
    sc = st.score_arrays()
    # rare words carry 3 pieces: the uniform head's argmax often lands on them, above the 0.5 threshold ...
    assert sc["rare_token"][0, 0] > CFG.rare_token
    # ... while a random argmax scores 1/n per sentence whatever the ties
    expect = len(corpus) / sum(s.attn.shape[-1] for s, _ in corpus)
    assert np.mean(sc["rare_token"][0, 1:]) == pytest.approx(expect, abs=0.02)
    rep = st.finalize("null", floor_sources=sources, n_boot=200)
    assert set(rep.classes["role"]) <= {"broad", "none"}
    without = st.roles()[0]   # thresholds alone: the uniform head is called rare-token
    assert "rare_token" in without[0]


def test_floor_check_refuses_a_head_whose_interval_touches_the_floor():
    cfg = replace(CFG, floor_margin=0.0)
    st = HeadStats(cfg, keep_per_sentence=True)
    n = 4
    for k in range(20):
        i = np.arange(n)
        prev = np.where(i > 0, i - 1, 0)
        # head 0: the previous word in every sentence; head 1: in even sentences only (share 0.5,
        # wide interval); head 2: the previous word from words 1 and 2, itself from word 3 (2/3
        # in every sentence: an interval of one point)
        half = prev if k % 2 == 0 else i
        steady = np.where(i == 3, 3, prev)
        st.update(Sentence(*onehot_attn(np.stack([prev, half, steady]))))
    share = st.score_arrays()["positional_share:-1"][0]
    assert share.tolist() == pytest.approx([1.0, 0.5, 2 / 3])
    ok, lo, hi = st.floor_check("positional_share:-1", np.ones((1, 3), bool), floor=0.4, n_boot=500)
    assert ok[0].tolist() == [True, False, True] and lo[0, 1] <= 0.4 < hi[0, 1]
    ok, lo, _ = st.floor_check("positional_share:-1", np.ones((1, 3), bool), floor=2 / 3, n_boot=500)
    assert lo[0, 2] == pytest.approx(2 / 3) and not ok[0, 2]          # touching is not beating
    with pytest.raises(ValueError, match="keep_per_sentence"):
        HeadStats(cfg).update(Sentence(*onehot_attn(np.array([[0, 0]])))).floor_check(
            "positional_share:-1", np.ones((1, 1), bool), 0.1)


def test_combine_floors_takes_the_largest_source_and_zero_for_syntactic_margins():
    f = combine_floors({"uniform": {"rare_token": 0.3, "syntactic_margin:det:dep2head": -0.2},
                        "random_init": {"rare_token": 0.45, "syntactic_margin:det:dep2head": float("nan")}})
    assert f == {"rare_token": 0.45, "syntactic_margin:det:dep2head": 0.0}
    with pytest.raises(ValueError, match="unknown floor sources"):
        combine_floors({"bogus": {}})


def test_syntactic_margin_interval_resamples_head_hits_minus_the_offset_baseline():
    # the det corpus above, repeated: head 0 is right on every det, the +1 offset on 3 of 5 per copy
    corpus = [([1, -1], ["det", "root"]), ([2, 2, -1], ["det", "amod", "root"]),
              ([3, 3, 3, -1, 3], ["det", "amod", "amod", "root", "punct"]), ([1, -1, 3, 1], ["det", "root", "det", "obj"])]
    to_head = lambda h, d: np.stack([np.where(h >= 0, h, np.arange(len(h))), np.arange(len(h))])  # noqa: E731
    st = HeadStats(CFG, keep_per_sentence=True)
    for _ in range(10):
        for heads, rels in corpus:
            st.update(tree_sentence(heads, rels, to_head))
    num, den = st._parts("syntactic_margin:det:dep2head")
    assert num.sum(0)[0, 0] / den.sum() == pytest.approx(2 / 5)      # the point margin, from the parts
    ok, lo, hi = st.floor_check("syntactic_margin:det:dep2head", np.ones((1, 2), bool), floor=0.0, n_boot=300)
    assert ok[0].tolist() == [True, False] and 0.0 < lo[0, 0] <= 2 / 5 <= hi[0, 0]


def test_floor_check_without_resamples_keeps_the_point_check_only():
    st = HeadStats(replace(CFG, floor_margin=0.1), keep_per_sentence=True)
    for k in range(4):
        st.update(Sentence(*onehot_attn(np.array([[0, 0, 1], [0, 1, 2]]))))   # -1 shares 2/2 and 0/2
    ok, lo, hi = st.floor_check("positional_share:-1", np.ones((1, 2), bool), floor=0.85, n_boot=0)
    assert ok[0].tolist() == [True, False] and np.isnan(lo).all() and np.isnan(hi).all()
    ok, _, _ = st.floor_check("positional_share:-1", np.ones((1, 2), bool), floor=0.95, n_boot=0)
    assert not ok.any()   # 1.0 < 0.95 + 0.1


@pytest.mark.filterwarnings("ignore:HeadStats. relations absent")
@pytest.mark.parametrize("rare_pieces, other_p", [(1, [1.0, 0.0, 0.0]),          # a word-level vocabulary
                                                  (2, [0.5, 0.4, 0.1]),
                                                  (3, [0.9, 0.1, 0.0])])        # rare words always longest
def test_uniform_head_gets_no_floor_checked_role_whatever_the_vocabulary(rare_pieces, other_p):
    rng = np.random.default_rng(1)
    st = HeadStats(CFG, keep_per_sentence=True)
    for k in range(80):
        n = int(rng.integers(4, 10))
        f = rng.integers(2, 500, n).astype(float)
        f[rng.integers(n)] = 1.0
        pieces = np.where(f == 1.0, rare_pieces, rng.choice([1, 2, 3], n, p=other_p))
        st.update(null_heads(pieces, [1, 1], draws=4, seed=k, freqs=f, heads=np.r_[-1, np.zeros(n - 1, int)],
                             deprels=["root"] + ["det"] * (n - 1)))
    uni = np.zeros((1, 5), bool)
    uni[0, 0] = True
    rep = st.finalize("null", floor_sources={"uniform": floor_scores(st, uni),
                                             "random_argmax": floor_scores(st, ~uni)}, n_boot=200)
    assert set(rep.classes["role"]) <= {"broad", "none"}
