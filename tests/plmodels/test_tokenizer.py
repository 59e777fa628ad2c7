"""plmodels.tokenizer: specials, exact word spans, save/load, parity with BERT's tokenizer."""
import json
import os

import pytest

from plmodels.tokenizer import Tokenizer, WordEncoding

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A lazy dog sleeps in the sun, and the fox runs away!",
    "Running, jumping and sleeping are what animals do.",
    "Don't the foxes know that dogs can't climb trees?",
    "The Sun rose over the Hills; the dogs were barking loudly.",
    "Under the trees, unbelievably quiet zebras sleep.",
] * 20
SENTENCES = [
    ["The", "quick", "fox", "jumps", "."],
    ["Unbelievably", ",", "the", "dogs", "don't", "climb", "!"],
    ["zebras", "sleep", "quietly"],
]


@pytest.fixture(scope="module")
def wp():
    return Tokenizer.train_wordpiece(CORPUS, vocab_size=200)


@pytest.fixture(scope="module")
def bpe():
    return Tokenizer.train_bpe(CORPUS, vocab_size=300)


def _check_spans(enc: WordEncoding, n_words: int, first: int, last: int):
    assert len(enc.word_spans) == n_words
    assert enc.word_spans[0][0] == first and enc.word_spans[-1][1] == last
    for (s, e), (s2, _) in zip(enc.word_spans, enc.word_spans[1:]):
        assert s < e and e == s2  # non-empty, contiguous
    assert enc.word_spans[-1][0] < enc.word_spans[-1][1]


def test_wordpiece_specials_at_documented_ids(wp):
    assert wp.kind == "wordpiece"
    assert [wp.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (wp.pad_id, wp.unk_id, wp.cls_id, wp.sep_id, wp.mask_id) == (0, 1, 2, 3, 4)
    assert wp.bos_id is None and wp.eos_id is None
    assert wp.special_ids == {0, 1, 2, 3, 4}
    assert wp.vocab_size == len(wp.hf.get_vocab())
    assert wp.token_to_id("[MASK]") == 4
    # A literal [MASK] in text is the special token, not split into pieces.
    assert wp.encode("the [MASK] dog", add_special=False)[1] == wp.mask_id


def test_wordpiece_word_spans_cover_and_decode(wp):
    for words in SENTENCES:
        enc = wp.encode_words(words)
        assert enc.ids[0] == wp.cls_id and enc.ids[-1] == wp.sep_id
        _check_spans(enc, len(words), 1, len(enc.ids) - 1)
        assert enc.n_empty == 0
        for w, (s, e) in zip(words, enc.word_spans):
            pieces = wp.tokens(enc.ids[s:e])
            assert "".join(p.removeprefix("##") for p in pieces) == w  # only ## pieces re-join
            assert wp.decode(enc.ids[s:e]).replace(" ", "") == w
        # Word-aligned encoding gives the same ids as running text.
        assert enc.ids == wp.encode(" ".join(words))
        plain = wp.encode_words(words, add_special=False)
        assert plain.ids == enc.ids[1:-1]
        assert plain.word_spans == [(s - 1, e - 1) for s, e in enc.word_spans]


def test_words_with_no_subword_get_unk(wp):
    enc = wp.encode_words(["the", "", "\x00", "dog"])
    assert enc.n_empty == 2
    assert [enc.ids[s:e] for s, e in enc.word_spans[1:3]] == [[wp.unk_id], [wp.unk_id]]
    _check_spans(enc, 4, 1, len(enc.ids) - 1)
    assert enc.ids[1:2] == wp.encode("the", add_special=False)


def test_encode_words_batch_matches_single(wp, bpe):
    batch = SENTENCES + [[]]
    for tok in (wp, bpe):
        out = tok.encode_words_batch(batch)
        assert out[:-1] == [tok.encode_words(ws) for ws in SENTENCES]
        assert out[-1].word_spans == [] and out[-1].ids == tok.encode("")


def test_lowercase_wordpiece_folds_case_and_accents():
    tok = Tokenizer.train_wordpiece(CORPUS + ["café cafe"] * 5, vocab_size=200, lowercase=True)
    assert tok.encode("THE Quick DOG") == tok.encode("the quick dog")
    assert tok.encode("café") == tok.encode("cafe")
    assert tok.lowercase


def test_bpe_spans_reconstruct_words_with_leading_space(bpe):
    assert bpe.kind == "bpe"
    assert bpe.bos_id == bpe.eos_id == bpe.pad_id == bpe.token_to_id("<|endoftext|>") == 0
    assert bpe.cls_id is None and bpe.mask_id is None
    for words in SENTENCES:
        enc = bpe.encode_words(words)
        assert enc.ids[0] == bpe.bos_id and enc.ids.count(bpe.bos_id) == 1  # BOS only, no EOS
        _check_spans(enc, len(words), 1, len(enc.ids))
        for i, (w, (s, e)) in enumerate(zip(words, enc.word_spans)):
            assert bpe.decode(enc.ids[s:e]) == (w if i == 0 else " " + w)
        assert enc.ids == bpe.encode(" ".join(words))
        assert bpe.encode_words(words, add_special=False).ids == enc.ids[1:]
    assert bpe.decode(bpe.encode("Héllo wörld ☃")) == "<|endoftext|>Héllo wörld ☃"  # byte-level: lossless
    assert bpe.decode(bpe.encode("dog"), skip_special=True) == "dog"


def test_bpe_vocab_must_hold_bytes():
    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer.train_bpe(CORPUS, vocab_size=100)


@pytest.mark.parametrize("kind", ["wp", "bpe"])
def test_save_load_round_trip(kind, wp, bpe, tmp_path):
    tok = wp if kind == "wp" else bpe
    tok.save(tmp_path / "tok")
    meta = json.loads((tmp_path / "tok" / "tokenizer_meta.json").read_text())
    assert meta["kind"] == tok.kind
    back = Tokenizer.load(tmp_path / "tok")
    assert back.fingerprint() == tok.fingerprint()
    assert (back.kind, back.special_ids, back.vocab_size) == (tok.kind, tok.special_ids, tok.vocab_size)
    for words in SENTENCES:
        assert back.encode_words(words) == tok.encode_words(words)
    # The HF file alone is importable and gives the same ids.
    imported = Tokenizer.from_hf_tokenizer_json(tmp_path / "tok" / "tokenizer.json")
    assert imported.kind == tok.kind
    assert imported.encode("The lazy dogs!") == tok.encode("The lazy dogs!")


def test_a_failed_save_keeps_the_old_files_and_leaves_no_temporaries(wp, bpe, tmp_path, monkeypatch):
    folder = bpe.save(tmp_path / "tok")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def disk_full(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", disk_full)   # every write fails after its bytes, before its rename
    with pytest.raises(OSError, match="disk full"):
        wp.save(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before   # no temporary, nothing of wp


def test_fingerprint_tells_tokenizers_apart(wp, bpe):
    assert Tokenizer.train_wordpiece(CORPUS, vocab_size=150).fingerprint() != wp.fingerprint()
    assert Tokenizer.train_wordpiece(CORPUS, vocab_size=200, lowercase=True).fingerprint() != wp.fingerprint()
    # Training is deterministic, so retraining reproduces the fingerprint (across processes: below).
    assert Tokenizer.train_wordpiece(CORPUS, vocab_size=200).fingerprint() == wp.fingerprint()
    assert Tokenizer.train_bpe(CORPUS, vocab_size=300).fingerprint() == bpe.fingerprint()
    assert Tokenizer.train_bpe(CORPUS, vocab_size=280).fingerprint() != bpe.fingerprint()


# Many distinct characters in continuation position and merges of equal count: the stock trainer numbered
# the "##" alphabet in hash order and broke these ties by those numbers, so two processes disagreed.
TIE_CORPUS = ["ab ac ad ae af ag ah ai aj ak al am an ao ap aq ar as at au av aw ax ay az",
              "ba ca da ea fa ga ha ia ja ka la ma na oa pa qa ra sa ta ua va wa xa ya za",
              "Çé naïve coöperate 中文 ½ x²  tab\tnew\nline"] * 3
def test_wordpiece_training_gives_the_same_vocabulary_every_time():
    # Each hash map the stock trainer makes draws its own seed (in one process too): trained four times on
    # TIE_CORPUS it gives four different vocabularies, so four equal ones here test the fixed order.
    vocabs = [Tokenizer.train_wordpiece(TIE_CORPUS, vocab_size=120)._hf.get_vocab() for _ in range(4)]
    assert all(v == vocabs[0] for v in vocabs[1:])             # tokens and ids
    assert len(vocabs[0]) == 120
    assert [vocabs[0][t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]


def test_wordpiece_alphabet_and_specials_are_the_stock_trainers():
    from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers

    from plmodels.tokenizer import _bert_normalizer

    ours = Tokenizer.train_wordpiece(TIE_CORPUS, vocab_size=120)
    stock = HFTokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    stock.normalizer = _bert_normalizer(False)
    stock.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    stock.train_from_iterator(TIE_CORPUS, trainer=trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], continuing_subword_prefix="##",
        show_progress=False))

    def alphabet(vocab):   # the single characters and their "##" forms: what the trainer starts from
        return {t for t in vocab if len(t) == 1 or (t.startswith("##") and len(t) == 3)}

    assert alphabet(ours._hf.get_vocab()) == alphabet(stock.get_vocab())
    assert len(ours._hf.get_vocab()) == len(stock.get_vocab())
    # the "##" alphabet given to the trainer as specials is not special in the tokenizer it returns
    assert sorted(t.content for t in ours._hf.get_added_tokens_decoder().values()) == sorted(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    assert "##b" not in ours._hf.encode("ab ##b", add_special_tokens=False).tokens


def test_load_missing_files_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer_meta.json|tokenizer.json"):
        Tokenizer.load(tmp_path)


VOCAB = [
    "[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "'", "?",
    "the", "The", "dog", "dogs", "run", "##s", "##ning", "cafe", "café", "un", "##believ", "##ably",
    "fox", "Fox", "##es", "s", "t", "don", "a", "##b", "##c", "中", "hello", "Hello", "##o",
]
PARITY_TEXTS = [
    "The dog runs.",
    "Hello, the Foxes don't run!",
    "Unbelievably café dogs?",
    "THE DOG RUNNING",
    "zebra abc 中文 the [MASK] dog",
    "   spaces\tand\nnewlines  ",
]


@pytest.mark.parametrize("lowercase", [True, False])
def test_from_bert_vocab_matches_transformers(lowercase, tmp_path):
    import transformers  # the test extra installs it; here, not at the top, so only this test fails without it
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    ours = Tokenizer.from_bert_vocab(path, lowercase=lowercase)
    ref = transformers.BertTokenizerFast(str(path), do_lower_case=lowercase)
    assert (ours.cls_id, ours.sep_id, ours.unk_id, ours.mask_id, ours.pad_id) == (3, 4, 2, 5, 0)
    assert ours.vocab_size == len(VOCAB)
    for text in PARITY_TEXTS:
        assert ours.encode(text) == ref(text)["input_ids"], text
    words = ["Unbelievably", "café", "dogs", "zebra"]
    ref_words = ref(words, is_split_into_words=True)
    enc = ours.encode_words(words)
    assert enc.ids == ref_words["input_ids"]
    ref_ids = ref_words.word_ids()
    for i, (s, e) in enumerate(enc.word_spans):
        assert [j for j, w in enumerate(ref_ids) if w == i] == list(range(s, e))


def test_from_bert_vocab_needs_specials(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\nthe\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[CLS\]"):
        Tokenizer.from_bert_vocab(path, lowercase=True)
