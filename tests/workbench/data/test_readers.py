"""Readers parse the hand-made fixtures exactly and name file and line on malformed input."""
from pathlib import Path

import pytest

from workbench.data.readers import (DataFormatError, Mention, Skips, iob2_spans, parse_ptb, ptb_leaf_matches,
                               read_conllu, read_iob2, read_ptb, read_sst2, strip_function_tags)

FIX = Path(__file__).resolve().parents[3] / "tests" / "fixtures"
ROW = "{i}\t{w}\t_\tX\tX\t_\t{h}\tdep\t_\t{m}"


def _conllu(tmp_path, body: str) -> Path:
    path = tmp_path / "bad.conllu"
    path.write_text(body, encoding="utf-8")
    return path


def _rows(*rows) -> str:
    return "\n".join(ROW.format(i=i, w=w, h=h, m=m) for i, w, h, m in rows) + "\n"


# ------------------------------------------------------------------------------------------ CoNLL-U
def test_conllu_words_multiword_and_empty_nodes():
    s1, s2, s3 = read_conllu(FIX / "mini.conllu")
    assert (s1.sent_id, s1.doc_id, s1.text) == ("doc_a-1", "doc_a", "Kim's friends visited Paris.")
    # the multiword token "Kim's" is surface info; the words are its parts
    assert s1.words == ("Kim", "'s", "friends", "visited", "Paris", ".")
    assert s1.multiword == ((0, 2, "Kim's"),)
    assert s1.upos == ("PROPN", "PART", "NOUN", "VERB", "PROPN", "PUNCT")
    assert s1.heads == (3, 1, 4, 0, 4, 4)
    assert s1.deprels == ("nmod:poss", "case", "nsubj", "root", "obj", "punct")
    assert s1.line == 5
    # the empty node 5.1 is not a word, but kept
    assert len(s2) == 7 and "liked" == s2.words[1] and s2.words[5] == "too"
    assert [n[0] for n in s2.empty_nodes] == ["5.1"]
    assert s2.heads == (2, 0, 2, 5, 2, 5, 2)
    assert (s3.doc_id, s3.words) == ("doc_b", ("Hello", "world", "."))


def test_conllu_entity_brackets_nested_and_single():
    s1, s2, s3 = read_conllu(FIX / "mini.conllu")
    got = [(m.entity, m.etype, m.start, m.end) for m in s1.mentions]
    # "(2-...(1-...)" on Kim opens 2 and a one-word mention of 1; "2)" on friends closes 2
    assert got == [("2", "person", 0, 3), ("1", "person", 0, 1), ("3", "place", 4, 5)]
    kim = s1.mentions[1]
    assert dict(kim.attrs) == {"infstat": "new", "salience": "nnnnn", "centering": "cf1", "minspan": "1",
                               "link": "coref", "identity": "Kim_Doe"}
    assert [(m.entity, m.start, m.end) for m in s2.mentions] == [("1", 0, 1), ("3", 2, 3), ("2", 4, 5)]
    assert s3.mentions == (Mention("4", "abstract", 1, 2, s3.mentions[0].attrs),)


def test_conllu_no_final_blank_line_is_fine(tmp_path):
    path = _conllu(tmp_path, "# sent_id = a\n" + _rows((1, "Hi", 0, "_"), (2, "!", 1, "_")).rstrip("\n"))
    (s,) = read_conllu(path)
    assert s.words == ("Hi", "!") and s.heads == (0, 1)


@pytest.mark.parametrize("body, line, words", [
    ("1\tHi\t_\tX\tX\t_\t0\tdep\t_\n", 1, "10 tab-separated columns, found 9"),
    (_rows((1, "a", 0, "_")) + "x\tb\t_\tX\tX\t_\t1\tdep\t_\t_\n", 2, "ID 'x' is not an integer"),
    (_rows((1, "a", 0, "_"), (2, "b", "one", "_")), 2, "HEAD 'one' is not an integer"),
    (_rows((1, "a", 0, "_"), (2, "b", 3, "_")), 2, "HEAD 3 out of range 0..2"),
    (_rows((1, "a", 0, "_"), (3, "b", 1, "_")), 2, "out of order"),
    # a truncated last sentence: its multiword range runs past the end of the file
    (_rows((1, "a", 0, "_")) + "\n1-2\tab\t_\t_\t_\t_\t_\t_\t_\t_\n" + _rows((1, "a", 0, "_")), 3, "ends past"),
    (_rows((1, "a", 0, "Entity=(1-person-new"), (2, "b", 1, "_")) + "\n", 1, "not closed"),
    (_rows((1, "a", 0, "Entity=(1-person-new)"), (2, "b", 1, "Entity=2)")), 2, "not open"),
    ("# sent_id = x\n# text = orphan\n", 3, "no words"),
])
def test_conllu_errors_name_file_and_line(tmp_path, body, line, words):
    path = _conllu(tmp_path, body)
    with pytest.raises(DataFormatError) as err:
        read_conllu(path)
    assert err.value.line == line and err.value.file == str(path)
    assert str(err.value).startswith(f"{path}:{line}: ") and words in str(err.value)


# --------------------------------------------------------------------------------------------- IOB2
def test_iob2_spans_and_invalid_runs_counted():
    sents, skips = read_iob2(FIX / "mini.iob2")
    assert [s.sent_id for s in sents] == ["doc_a-1", "doc_a-2", "doc_b-1", "doc_c-1"]
    assert sents[0].spans == (("PER", 0, 1), ("LOC", 4, 5))
    # B-PER I-LOC I-LOC , I-ORG: the I-LOC run follows another type and I-ORG follows O
    assert sents[1].spans == (("PER", 0, 1),) and sents[1].invalid_spans == 2
    assert sents[3].spans == (("LOC", 0, 2),)        # span ending at the end of the file
    assert skips == Skips({"invalid_iob2_span": 2})


def test_iob2_invalid_is_an_error_when_not_skipped():
    with pytest.raises(DataFormatError) as err:
        read_iob2(FIX / "mini.iob2", skip_invalid=False)
    assert err.value.line == 14 and "I-LOC" in str(err.value) and "mini.iob2:14:" in str(err.value)


def test_iob2_unknown_tag_is_an_error(tmp_path):
    path = tmp_path / "x.iob2"
    path.write_text("# sent_id = a\n1\tBob\tB-PERSON\t-\t-\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"x\.iob2:2: tag 'B-PERSON'"):
        read_iob2(path)


def test_iob2_spans_function():
    assert iob2_spans(["B-PER", "I-PER", "B-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5)]


# ---------------------------------------------------------------------------------------------- PTB
def test_ptb_constituents_by_hand():
    t1, t2, t3 = read_ptb(FIX / "mini.ptb")
    assert t1.leaves == ("Kim", "'s", "friends", "visited", "Paris", ".")
    assert t1.tags == ("NNP", "POS", "NNS", "VBD", "NNP", ".")
    got = [(c.label, c.raw_label, c.start, c.end, c.depth) for c in t1.constituents]
    assert got == [("ROOT", "ROOT", 0, 6, 0), ("S", "S", 0, 6, 1), ("NP", "NP-SBJ", 0, 3, 2),
                   ("NP", "NP", 0, 2, 3), ("VP", "VP", 3, 5, 2), ("NP", "NP", 4, 5, 3)]
    assert [(c.label, c.start, c.end) for c in t2.constituents][2:4] == [("NP", 0, 1), ("NP", 0, 1)]
    assert (t1.line, t2.line, t3.line) == (1, 2, 3)


def test_ptb_brackets_and_escapes():
    t = parse_ptb("( (S (PRN (-LRB- -LRB-) (NP (NN L2)) (-RRB- -RRB-)) (NP (-LRB- [) (CD 1) (-RRB- ]))))")
    assert t.leaves == ("-LRB-", "L2", "-RRB-", "[", "1", "]")
    assert [(c.label, c.start, c.end) for c in t.constituents] == [
        ("", 0, 6), ("S", 0, 6), ("PRN", 0, 3), ("NP", 1, 2), ("NP", 3, 6)]
    assert ptb_leaf_matches("-LRB-", "(") and ptb_leaf_matches("-LRB-a-RRB-", "(a)")
    assert ptb_leaf_matches("[", "[") and not ptb_leaf_matches("-LRB-", "a")
    assert [strip_function_tags(x) for x in ("NP-SBJ", "PP-DIR=2", "S-NOM-1", "-NONE-", "NP")] == [
        "NP", "PP", "S", "-NONE-", "NP"]


@pytest.mark.parametrize("tree, words", [
    ("(S (NP (NN a))", "not closed"), ("(S (NN a)))", "unbalanced"), ("(S (NN a b))", "two words"),
    ("(S a (NP (NN b)))", "mixes"), ("(S (NP))", "empty"),
])
def test_ptb_errors_name_file_and_line(tmp_path, tree, words):
    path = tmp_path / "t.ptb"
    path.write_text("(S (NN ok))\n\n" + tree + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        read_ptb(path)
    assert err.value.line == 3 and words in str(err.value) and str(path) in str(err.value)


# -------------------------------------------------------------------------------------------- SST-2
def test_sst2_labeled_and_unlabeled():
    rows = read_sst2(FIX / "sst2_train.tsv")
    assert [(r.text, r.label, r.line) for r in rows] == [("it 's a charming journey .", 1, 2),
                                                          ("bleak and desperate", 0, 3)]
    test = read_sst2(FIX / "sst2_test.tsv")
    assert [(r.text, r.label) for r in test] == [("uneasy mishmash .", None), ("a poor imitation .", None)]


def test_sst2_bad_label_names_line(tmp_path):
    path = tmp_path / "s.tsv"
    path.write_text("sentence\tlabel\ngood\t1\nbad\tneg\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"s\.tsv:3: label 'neg'"):
        read_sst2(path)
