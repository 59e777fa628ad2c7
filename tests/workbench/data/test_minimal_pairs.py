"""The minimal-pair suites: one-word pairs, the other-number forms from the treebanks, attractors counted
by hand, nonce variants that keep the controller and the critical word, and the template suites."""
from __future__ import annotations

from collections import Counter

import pytest

from workbench.core.paths import data_root
from workbench.data.minimal_pairs import (
    Lexicon,
    PairRecord,
    build_suites,
    cached_suites,
    det_agreement,
    nonce_words,
    suite_counts,
    sv_agreement,
    template_pairs,
)
from workbench.data.pair_templates import TEMPLATES
from workbench.data.readers import Sentence, Skips

needs_data = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")


def sentence(rows: list[tuple[str, str, str, str, int, str]]) -> Sentence:
    """A Sentence from (form, lemma, upos, feats, head, deprel) rows."""
    f = list(zip(*rows))
    n = len(rows)
    return Sentence(sent_id="s", text=" ".join(f[0]), doc_id="d", words=f[0], lemmas=f[1], upos=f[2],
                    xpos=("_",) * n, feats=f[3], heads=f[4], deprels=f[5], misc=("_",) * n, line=7)


KEYS = sentence([
    ("The", "the", "DET", "Definite=Def|PronType=Art", 2, "det"),
    ("keys", "key", "NOUN", "Number=Plur", 7, "nsubj"),
    ("to", "to", "ADP", "_", 5, "case"),
    ("the", "the", "DET", "Definite=Def|PronType=Art", 5, "det"),
    ("cabinet", "cabinet", "NOUN", "Number=Sing", 2, "nmod"),
    ("are", "be", "AUX", "Mood=Ind|Number=Plur|Person=3|Tense=Pres|VerbForm=Fin", 7, "cop"),
    ("here", "here", "ADV", "PronType=Dem", 0, "root"),
    ("this", "this", "DET", "Number=Sing|PronType=Dem", 9, "det"),
    ("cabinet", "cabinet", "NOUN", "Number=Sing", 7, "obl"),
])
IS = sentence([("It", "it", "PRON", "Case=Nom|Number=Sing|Person=3", 2, "nsubj"),
               ("is", "be", "AUX", "Mood=Ind|Number=Sing|Person=3|Tense=Pres|VerbForm=Fin", 0, "root")])


def test_agreement_by_hand_the_verb_swapped_the_attractor_counted():
    lex = Lexicon.build([KEYS, IS])
    skips = Skips()
    [(subj, verb, bad, cond, k)] = sv_agreement(KEYS, lex, skips)
    assert (subj, verb, bad, cond, k) == (1, 5, "is", "attractors:1", 1)  # "cabinet" is a singular attractor
    assert det_agreement(KEYS, skips) == [(8, 7, "these", "adjacent", 0)]
    # with no singular finite "be" in the treebank there is no other form: skipped and counted
    assert sv_agreement(KEYS, Lexicon.build([KEYS]), skips) == [] and skips["sv_no_other_form"] == 1


def test_nonce_words_keep_the_critical_word_and_controller_and_the_class_of_the_others():
    other = sentence([("The", "the", "DET", "Definite=Def|PronType=Art", 2, "det"),
                      ("doors", "door", "NOUN", "Number=Plur", 0, "root"),
                      ("doors", "door", "NOUN", "Number=Plur", 2, "dep"),
                      ("drawer", "drawer", "NOUN", "Number=Sing", 2, "dep"),
                      ("drawer", "drawer", "NOUN", "Number=Sing", 2, "dep")])
    lex = Lexicon.build([KEYS, other], min_count=2)
    import random
    words = nonce_words(KEYS, {1, 5}, lex, random.Random(0))
    assert words[1] == "keys" and words[5] == "are"  # controller and critical word kept
    assert words[4] in ("cabinet", "drawer") and words[8] in ("cabinet", "drawer")  # singular nouns only
    changed = {nonce_words(KEYS, {1, 5}, lex, random.Random(s))[4] for s in range(20)}
    assert changed == {"cabinet", "drawer"}


@pytest.fixture(scope="module")
def suites():
    return build_suites()


def _one_word_apart(r: PairRecord) -> bool:
    diff = [i for i, (a, b) in enumerate(zip(r.good, r.bad)) if a != b]
    return len(r.good) == len(r.bad) and diff == [r.critical]


@needs_data
def test_ud_agreement_has_1000_pairs_with_attractors_and_every_pair_differs_in_one_word(suites):
    records, skips = suites
    assert all(_one_word_apart(r) for r in records), [r.id for r in records if not _one_word_apart(r)][:5]
    sv = [r for r in records if r.phenomenon == "subject_verb_agreement" and r.variant == "original"]
    assert len(sv) >= 1000 and {r.source.split("-")[0] for r in sv} == {"en_ewt", "en_gum"}
    attr = Counter(r.attractors for r in sv)
    assert attr[1] >= 100 and sum(v for k, v in attr.items() if k >= 2) >= 50
    assert all(r.condition == f"attractors:{min(r.attractors, 2)}{'+' if r.attractors >= 2 else ''}" for r in sv)
    swaps = Counter((r.good_word.lower(), r.bad_word.lower()) for r in sv)
    for pair in (("is", "are"), ("are", "is"), ("was", "were"), ("were", "was"), ("has", "have"), ("have", "has")):
        assert swaps[pair] >= 10, pair
    assert sum(v for (g, b), v in swaps.items() if g == b + "s" or b == g + "s") >= 100  # -s / bare
    assert skips["sv_no_other_form"] > 0  # e.g. past tense of a regular verb: never swapped to itself


@needs_data
def test_every_ud_item_has_a_nonce_twin_with_the_same_critical_swap(suites):
    records, _ = suites
    by_id = {r.id: r for r in records}
    ud = [r for r in records if r.suite == "ud" and r.variant == "original"]
    twins = [by_id[r.id + ":nonce"] for r in ud]
    assert all(t.good_word == r.good_word and t.bad_word == r.bad_word and len(t.good) == len(r.good)
               for r, t in zip(ud, twins))
    changed = sum(t.good != r.good for r, t in zip(ud, twins))
    assert changed > 0.9 * len(ud)  # almost every sentence has a content word to replace
    assert {r.phenomenon for r in ud} == {"subject_verb_agreement", "determiner_noun_agreement", "reflexive"}


def test_templates_give_distinct_seeded_pairs_of_each_template():
    a, b = template_pairs(300, seed=0), template_pairs(300, seed=0)
    assert a == b and template_pairs(300, seed=1) != a
    counts = Counter(r.source for r in a)
    assert set(counts) == {t.template for t in TEMPLATES} and set(counts.values()) == {300}
    assert all(_one_word_apart(r) and r.seed == 0 for r in a)
    assert len({r.good for r in a}) == len(a)
    agr = [r for r in a if r.phenomenon == "agreement_pp"]
    assert {(r.good_word, r.bad_word) for r in agr} >= {("laughs", "laugh"), ("laugh", "laughs")}
    assert all(r.attractors == (r.condition.endswith("mismatch")) for r in agr)
    table = suite_counts(a)
    assert table["pairs"].sum() == 7 * 300


@needs_data
def test_the_suite_cache_reads_back_the_same_records(suites, tmp_path):
    built = cached_suites(tmp_path)
    [path] = tmp_path.glob("pairs-v*.jsonl")
    assert built == list(suites[0]) and cached_suites(tmp_path) == built
    path.write_text(path.read_text().splitlines()[0] + "\n")  # a read, not a rebuild
    assert len(cached_suites(tmp_path)) == 1
