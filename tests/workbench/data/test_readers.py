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
    # UD basic dependencies are one tree: one root, every word reaches it
    (_rows((1, "a", 2, "_"), (2, "b", 1, "_"), (3, "c", 0, "_")), 1, "dependency cycle 1 -> 2 -> 1 "),
    ("# sent_id = s\n" + _rows((1, "a", 0, "_"), (2, "b", 4, "_"), (3, "c", 2, "_"), (4, "d", 3, "_")), 3,
     "dependency cycle 2 -> 4 -> 3 -> 2 (word -> its HEAD): word 2 has no path to the root"),
    (_rows((1, "a", 0, "_"), (2, "b", 2, "_")), 2, "dependency cycle 2 -> 2 "),
    (_rows((1, "a", 0, "_")) + "\n" + _rows((1, "a", 2, "_"), (2, "b", 1, "_")), 3,
     "sentence has no root: no word has HEAD 0"),
    (_rows((1, "a", 0, "_"), (2, "b", 0, "_"), (3, "c", 0, "_")), 2,
     "sentence has 3 roots: words 1, 2, 3 have HEAD 0 (UD allows exactly one)"),
    # integer fields are ASCII digits: int() alone would read "1_0" as 10 and " 2" as 2
    (_rows((1, "a", 0, "_"), (2, "b", "1_0", "_")), 2, "HEAD '1_0' is not an integer"),
    (_rows((1, "a", 0, "_"), (" 2", "b", 1, "_")), 2, "ID ' 2' is not an integer"),
    (_rows((1, "a", 0, "_")) + " \t \n", 2, "line has only spaces or tabs"),
    ("1\tHi\r\t_\tX\tX\t_\t0\tdep\t_\t_\n", 1, "carriage return (\\r) inside the line"),
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


# ------------------------------------------------------------------------- all readers: bytes and empty files
READERS = {"conllu": (read_conllu, "mini.conllu"), "iob2": (lambda p: read_iob2(p)[0], "mini.iob2"),
           "ptb": (read_ptb, "mini.ptb"), "sst2": (read_sst2, "sst2_train.tsv")}


def _write(tmp_path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fmt", list(READERS))
def test_bom_and_crlf_read_like_the_plain_file(tmp_path, fmt):
    reader, fixture = READERS[fmt]
    data = (FIX / fixture).read_bytes()
    want = reader(FIX / fixture)
    assert reader(_write(tmp_path, fixture, b"\xef\xbb\xbf" + data)) == want
    (tmp_path / "crlf").mkdir()
    assert reader(_write(tmp_path / "crlf", fixture, data.replace(b"\n", b"\r\n"))) == want


@pytest.mark.parametrize("fmt, word", [("conllu", b"Paris"), ("iob2", b"Paris"), ("ptb", b"Paris"),
                                       ("sst2", b"charming")])
def test_latin1_byte_names_file_line_and_iconv(tmp_path, fmt, word):
    reader, fixture = READERS[fmt]
    data = (FIX / fixture).read_bytes().replace(word, b"caf\xe9", 1)
    line = data[:data.index(b"caf\xe9")].count(b"\n") + 1
    path = _write(tmp_path, fixture, data)
    with pytest.raises(DataFormatError) as err:
        reader(path)
    assert (err.value.file, err.value.line) == (str(path), line)
    assert str(err.value).startswith(f"{path}:{line}: not UTF-8: byte 0xe9 at byte ")
    assert "caf\\xe9" in str(err.value) and f"iconv -f latin1 -t utf-8 {fixture}" in str(err.value)


def test_bad_byte_far_into_the_file_is_found_on_its_line(tmp_path):
    # past the first read-ahead chunk of the text layer, so the line is found in the bytes
    body = "".join(f"# sent_id = s{k}\n" + _rows((1, "word", 0, "_"), (2, ".", 1, "_")) + "\n"
                   for k in range(1000)).encode()
    at = body.index(b"# sent_id = s900\n")
    data = body[:at] + b"# text = na\xefve\n" + body[at:]
    path, line = _write(tmp_path, "far.conllu", data), data[:at].count(b"\n") + 1
    assert line > 3000
    with pytest.raises(DataFormatError, match=rf"far\.conllu:{line}: not UTF-8"):
        read_conllu(path)


def test_utf16_file_says_so(tmp_path):
    path = _write(tmp_path, "w.conllu", (FIX / "mini.conllu").read_text(encoding="utf-8").encode("utf-16"))
    with pytest.raises(DataFormatError, match=r"w\.conllu:1: not UTF-8: byte 0xff .*looks like UTF-16: `iconv -f utf-16"):
        read_conllu(path)


@pytest.mark.parametrize("fmt", list(READERS))
@pytest.mark.parametrize("body, why", [(b"", "the file is empty"), (b"\n\n\n", "its 3 line(s) hold only")])
def test_file_without_sentences_is_an_error(tmp_path, fmt, body, why):
    reader, fixture = READERS[fmt]
    path = _write(tmp_path, fixture, body)
    with pytest.raises(DataFormatError) as err:
        reader(path)
    if fmt == "sst2" and body:                           # the first line is the header
        assert "header" in str(err.value)
    else:
        assert str(err.value).startswith(f"{path}:1: no sentences: {why}")


@pytest.mark.parametrize("fmt", ["conllu", "iob2"])
def test_file_with_only_comments_is_an_error(tmp_path, fmt):
    reader, fixture = READERS[fmt]
    path = _write(tmp_path, fixture, b"# just a note\n\n# another\n")
    with pytest.raises(DataFormatError, match=r":1: no sentences: its 3 line\(s\) hold only blank lines or comments"):
        reader(path)


def test_sst2_header_only_and_very_long_rows(tmp_path):
    with pytest.raises(DataFormatError, match=r"h\.tsv:1: no sentences: its 1 line\(s\) hold only the header"):
        read_sst2(_write(tmp_path, "h.tsv", b"sentence\tlabel\n"))
    # csv's 128 KiB field limit used to crash here with _csv.Error
    (row,) = read_sst2(_write(tmp_path, "long.tsv", b"sentence\tlabel\n" + b"a" * 200_000 + b"\t1\n"))
    assert (len(row.text), row.label, row.line) == (200_000, 1, 2)
