"""Alignment: word spans survive the cut into pieces; truncation and windows count what they drop."""
import numpy as np
import pytest

from plmodels.tokenizer import Tokenizer
from workbench.data.align import align_sentences

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "unbelievable things happen",
         "the cat and the dog are friends"] * 5


@pytest.fixture(scope="module")
def wp():
    return Tokenizer.train_wordpiece(TEXTS, vocab_size=60)


@pytest.fixture(scope="module")
def bpe():
    return Tokenizer.train_bpe(TEXTS, vocab_size=280)


def _check_piece_words(tok, words, piece):
    """Each word's tokens in the piece equal that word's own encoding."""
    for w in np.unique(piece.tok_word[piece.tok_word >= 0]):
        toks = piece.ids[piece.tok_word == w].tolist()
        alone = tok.encode_words([words[w]], add_special=False).ids
        if tok.kind == "wordpiece":
            assert toks == alone
        else:  # BPE words after the first carry a leading space
            assert len(toks) >= 1


@pytest.mark.parametrize("name", ["wp", "bpe"])
def test_short_sentences_are_one_piece_with_specials(name, request):
    tok = request.getfixturevalue(name)
    sents = [["the", "cat", "sat"], ["unbelievable", "things"], []]
    al = align_sentences(tok, sents, max_positions=64)
    assert len(al.pieces) == 3 and al.n_dropped_words == 0
    for s, p in enumerate(al.pieces):
        assert p.own_words.tolist() == list(range(len(sents[s])))
        if tok.kind == "wordpiece":
            assert p.ids[0] == tok.cls_id and p.ids[-1] == tok.sep_id
        else:
            assert p.ids[0] == tok.bos_id
        _check_piece_words(tok, sents[s], p)


def test_truncate_drops_tail_words_and_counts_them(wp):
    words = "unbelievable things happen the cat sat on the mat".split()
    enc = wp.encode_words(words)
    limit = enc.word_spans[3][1] + 1  # room for words 0..3 plus [SEP]
    al = align_sentences(wp, [words, ["the", "cat"]], max_positions=limit, policy="truncate")
    assert al.n_kept.tolist() == [4, 2]
    assert al.n_truncated_sentences == 1 and al.n_dropped_words == len(words) - 4
    p = al.pieces[0]
    assert len(p.ids) <= limit and p.ids[-1] == wp.sep_id
    assert p.ids[:-1].tolist() == enc.ids[: enc.word_spans[3][1]]


def test_window_covers_every_word_once_with_most_context(wp):
    words = ("the cat sat on the mat and the dog ran in the park " * 3).split()
    limit = 12
    al = align_sentences(wp, [words], max_positions=limit, policy="window")
    assert al.n_dropped_words == 0 and al.n_windowed_sentences == 1 and len(al.pieces) > 2
    owned = np.concatenate([p.own_words for p in al.pieces])
    assert sorted(owned.tolist()) == list(range(len(words)))
    for p in al.pieces:
        assert len(p.ids) <= limit
        _check_piece_words(wp, words, p)
    # a middle word is owned by a window where it is not at the edge
    mid = len(words) // 2
    owner = next(p for p in al.pieces if mid in p.own_words)
    pos = np.flatnonzero(owner.tok_word == mid)
    assert pos.min() > 1 and pos.max() < len(owner.ids) - 2


def test_unknown_policy_is_an_error(wp):
    with pytest.raises(ValueError, match="policy"):
        align_sentences(wp, [["a"]], 10, policy="chop")
