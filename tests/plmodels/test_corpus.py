"""plmodels.training.corpus: sources, the token cache, and deterministic packing."""
import gzip
import json
import os

import numpy as np
import pytest

from plmodels.tokenizer import Tokenizer
from plmodels.training import corpus
from plmodels.training.corpus import PackedDataset, chunk_text, iter_texts, sample_texts_for_tokenizer, tokenize_to_cache

TEXT = ("It was the best of times, it was the worst of times.\n"
        "  Call me Ishmael.  \n\nThe sun shone, having no alternative, on the nothing new.\n") * 30


@pytest.fixture(scope="module")
def wp():
    return Tokenizer.train_wordpiece([TEXT], vocab_size=150)


@pytest.fixture(scope="module")
def bpe():
    return Tokenizer.train_bpe([TEXT], vocab_size=300)


# ---------------------------------------------------------------------------- packing
def test_mlm_packing_covers_stream_once_per_epoch():
    ids = np.arange(10, 10 + 1003)  # distinct values: coverage is checkable
    ds = PackedDataset(ids, seq_len=10, seed=3, mode="mlm", cls_id=1, sep_id=2)
    assert len(ds) == 1003 // 8 and ds.remainder == 1003 - len(ds) * 8 == 3
    for epoch in (0, 1):
        seqs = [seq for _, b in ds.iter_batches(epoch, batch_size=16) for seq in b]
        assert all(s.shape == (10,) and s[0] == 1 and s[-1] == 2 for s in seqs)
        body = np.sort(np.concatenate([s[1:-1] for s in seqs]))
        np.testing.assert_array_equal(body, ids[: len(ds) * 8])


def test_clm_windows_predict_every_token_once():
    ids = np.arange(5, 5 + 1000)
    ds = PackedDataset(ids, seq_len=16, seed=0, mode="clm")
    assert len(ds) == (1000 - 1) // 16 and ds.remainder == 1000 - (len(ds) * 16 + 1)
    assert ds.item_len == 17
    batches = [b for _, b in ds.iter_batches(0, batch_size=7)]
    assert all(b.dtype == np.int64 and b.shape[1] == 17 for b in batches)
    targets = np.sort(np.concatenate([b[:, 1:].ravel() for b in batches]))
    np.testing.assert_array_equal(targets, ids[1: len(ds) * 16 + 1])
    np.testing.assert_array_equal(ds[1][0], ds[0][-1])  # windows share their border token


def test_order_is_seeded_by_seed_and_epoch():
    ids = np.arange(4000)
    a, b = PackedDataset(ids, 8, seed=1), PackedDataset(ids.copy(), 8, seed=1)
    np.testing.assert_array_equal(a.order(0), b.order(0))
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), PackedDataset(ids, 8, seed=2).order(0))
    np.testing.assert_array_equal(np.sort(a.order(5)), np.arange(len(a)))


def test_resume_continues_the_same_order():
    ds = PackedDataset(np.arange(3000), 8, seed=7)
    full = [b for _, b in ds.iter_batches(2, batch_size=5)]
    resumed = [b for _, b in ds.iter_batches(2, batch_size=5, start=40)]
    assert len(resumed) == len(full) - 8
    for x, y in zip(resumed, full[8:]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(ds.batch(2, 40, 5), full[8])


def test_for_tokenizer_picks_layout(wp, bpe):
    ids = np.arange(20, 120)
    enc = PackedDataset.for_tokenizer(ids, 12, 0, wp)
    assert enc.mode == "mlm" and enc[0][0] == wp.cls_id and enc[0][-1] == wp.sep_id
    assert PackedDataset.for_tokenizer(ids, 12, 0, bpe).mode == "clm"
    with pytest.raises(ValueError, match="cls_id"):
        PackedDataset(ids, 12, 0, mode="mlm")


# ---------------------------------------------------------------------------- chunking
@pytest.mark.parametrize("kind", ["wp", "bpe"])
def test_chunking_never_changes_ids(kind, wp, bpe):
    tok = wp if kind == "wp" else bpe
    text = TEXT + "tail  \n  \n\n x\n\n\n"
    chunks = list(chunk_text(text, 50))
    assert len(chunks) > 10 and "".join(chunks) == text
    assert all(c.startswith("\n") for c in chunks[1:])
    assert [i for c in chunks for i in tok.encode(c, add_special=False)] == tok.encode(text, add_special=False)


# ------------------------------------------------------------------------------ caching
def _user_corpus(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT[:500], encoding="utf-8")
    (folder / "b.txt").write_text("Call me Ishmael. The end.", encoding="utf-8")
    return folder


@pytest.mark.parametrize("kind", ["wp", "bpe"])
def test_cache_layout_and_hit(kind, wp, bpe, tmp_path, capsys):
    tok = wp if kind == "wp" else bpe
    src = _user_corpus(tmp_path)
    ids = corpus.cached_corpus(src, None, tok, tmp_path / "cache")
    expected = []
    for doc in iter_texts(src):
        expected += tok.encode(doc, add_special=False) + [tok.doc_sep_id]
    assert ids.dtype == np.uint16 and ids.tolist() == expected
    assert "tok/s" in capsys.readouterr().err

    path = ids.filename
    mtime = os.stat(path).st_mtime_ns
    again = corpus.cached_corpus(src, None, tok, tmp_path / "cache")
    assert os.stat(path).st_mtime_ns == mtime and again.tolist() == expected

    def boom():
        raise AssertionError("texts were read on a cache hit")
        yield  # pragma: no cover

    hit = tokenize_to_cache(boom(), tok, path, key=corpus.source_key(src))
    assert hit.tolist() == expected

    (src / "b.txt").write_text("Something else entirely.", encoding="utf-8")
    changed = corpus.cached_corpus(src, None, tok, tmp_path / "cache")
    assert changed.tolist() != expected
    assert corpus.read_cache_meta(path)["n_docs"] == 2


def test_whitespace_documents_are_skipped_and_counted(wp, tmp_path):
    ids = tokenize_to_cache(["the best", "  \n", "of times"], wp, tmp_path / "c.ids", progress=False)
    assert ids.tolist().count(wp.sep_id) == 2
    meta = corpus.read_cache_meta(tmp_path / "c.ids")
    assert (meta["n_docs"], meta["n_skipped"], meta["key"]) == (2, 1, None)
    with pytest.raises(ValueError, match="no text"):
        tokenize_to_cache(["", " "], wp, tmp_path / "d.ids", progress=False)
    assert not (tmp_path / "d.ids").exists() and not list(tmp_path.glob(".d.ids*"))


# ------------------------------------------------------------------------------ sources
def test_empty_and_unreadable_files_are_named(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.txt"):
        iter_texts(empty)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n ")
    with pytest.raises(ValueError, match="blank.txt"):
        list(iter_texts(blank))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe bytes")
    with pytest.raises(ValueError, match="bad.txt"):
        list(iter_texts(bad))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        iter_texts(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="no splits"):
        iter_texts(bad, "valid")


def test_named_formats_on_small_copies(tmp_path):
    gut = tmp_path / "gutenberg_pd"
    gut.mkdir()
    with gzip.open(gut / "gutenberg_en.valid.jsonl.gz", "wt", encoding="utf-8") as f:
        for t in ("Book one.", "Book two."):
            f.write(json.dumps({"author": "A", "title": "T", "text": t}) + "\n")
    assert list(iter_texts(gut, "valid")) == ["Book one.", "Book two."]
    with pytest.raises(FileNotFoundError, match="gutenberg_en.train.jsonl.gz"):
        iter_texts(gut, "train")
    with gzip.open(gut / "gutenberg_en.train.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write('{"text": "fine"}\n{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"gutenberg_en.train.jsonl.gz:2"):
        list(iter_texts(gut, "train"))

    wiki = tmp_path / "wikitext2"
    wiki.mkdir()
    (wiki / "wiki.valid.tokens").write_text(
        " \n = A = \n \n a text \n = = Sub = = \n more \n = B = \n b text \n", encoding="utf-8")
    docs = list(iter_texts(wiki, "valid"))
    assert len(docs) == 2 and docs[0].startswith(" \n = A =") and "= = Sub = =" in docs[0]
    assert docs[1] == " = B = \n b text \n"

    sh = tmp_path / "tiny_shakespeare"
    sh.mkdir()
    lines = "".join(f"line {i}\n" for i in range(100))
    (sh / "input.txt").write_text(lines, encoding="utf-8")
    train, valid = list(iter_texts(sh, "train")), list(iter_texts(sh, "valid"))
    assert train[0] + valid[0] == lines and train[0].endswith("\n") and 0.85 < len(train[0]) / len(lines) < 0.95


def test_real_wikitext_articles():
    folder = os.path.join(os.environ.get("WORKBENCH_DATA", os.path.join(os.path.dirname(__file__), "../../../shared/data")), "wikitext2")
    if not os.path.isdir(folder):
        pytest.skip("shared data not present")
    assert sum(1 for _ in iter_texts(folder, "valid")) == 60  # SOURCE.md: 60 articles


def test_sample_for_tokenizer_is_bounded_and_seeded(tmp_path):
    src = tmp_path / "big.txt"
    src.write_text(TEXT * 20, encoding="utf-8")
    a = sample_texts_for_tokenizer(src, 20_000, seed=0)
    assert 0 < sum(map(len, a)) <= 20_000
    assert a == sample_texts_for_tokenizer(src, 20_000, seed=0)
    assert a != sample_texts_for_tokenizer(src, 20_000, seed=1)
    assert "".join(sample_texts_for_tokenizer(src, 10**9)) == TEXT * 20


def test_a_failed_rebuild_keeps_the_old_cache_and_its_key_and_no_temporaries(wp, tmp_path):
    path = tmp_path / "c.ids"
    old = tokenize_to_cache([TEXT], wp, path, key={"source": "a"}, progress=False).tolist()
    meta = corpus.read_cache_meta(path)

    def source_fails_midway():
        yield from [TEXT] * 200
        raise OSError("source went away")

    with pytest.raises(OSError, match="source went away"):
        tokenize_to_cache(source_fails_midway(), wp, path, key={"source": "b"}, progress=False)
    assert corpus.read_cache_meta(path) == meta
    assert tokenize_to_cache(iter(()), wp, path, key={"source": "a"}, progress=False).tolist() == old   # a hit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.ids", "c.ids.meta.json"]
