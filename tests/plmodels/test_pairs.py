"""Tests for the sentence-pair objectives: BERT's NSP and ALBERT's sentence-order prediction."""
import pytest
import torch

from plmodels.training.masking import nsp_pairs, sop_pairs, step_generator

CLS, SEP = 2, 3


def _corpus(B, L):
    """Rows of distinct ids, each a run of consecutive integers: row i holds 5 + i*L ... 5 + i*L + L-1."""
    return torch.arange(5, 5 + B * L).view(B, L)


def _split(row):
    """[CLS] X [SEP] Y [SEP] -> (X, Y), checking the specials' places."""
    seps = (row == SEP).nonzero().flatten().tolist()
    assert row[0] == CLS and len(seps) == 2 and seps[1] == len(row) - 1 and (row == CLS).sum() == 1
    return row[1:seps[0]], row[seps[0] + 1:-1]


def test_sop_positives_in_order_and_negatives_swapped():
    B, L = 400, 12
    content = _corpus(B, L)
    ids, types, labels = sop_pairs(content, cls_id=CLS, sep_id=SEP, generator=step_generator(3, 4))
    assert ids.shape == types.shape == (B, L + 3) and labels.shape == (B,)
    for i in range(B):
        first, second = _split(ids[i])
        assert len(first) >= 1 and len(second) >= 1
        a, b = (first, second) if labels[i] == 0 else (second, first)
        assert torch.equal(torch.cat([a, b]), content[i]), f"row {i}: A + B is not the row in order"
        if labels[i] == 1:  # swapped: the first segment continues the second
            assert first[0] == second[-1] + 1
        expected_types = [0] * (len(first) + 2) + [1] * (len(second) + 1)
        assert types[i].tolist() == expected_types
    assert set(labels.tolist()) == {0, 1}
    assert abs(labels.float().mean().item() - 0.5) < 0.1  # 400 rows: sd 0.025
    cuts = torch.tensor([len(_split(ids[i])[0 if labels[i] == 0 else 1]) for i in range(B)])
    assert cuts.min() == 1 and cuts.max() == L - 1, "the cut ranges over 1..L-1"


def test_sop_one_row_and_reproducible():
    content = _corpus(1, 2)
    ids, types, labels = sop_pairs(content, cls_id=CLS, sep_id=SEP, generator=step_generator(0, 0))
    expected = {0: [CLS, 5, SEP, 6, SEP], 1: [CLS, 6, SEP, 5, SEP]}[labels.item()]
    assert ids.tolist() == [expected] and types.tolist() == [[0, 0, 0, 1, 1]]
    again = sop_pairs(content, cls_id=CLS, sep_id=SEP, generator=step_generator(0, 0))
    assert torch.equal(ids, again[0])
    with pytest.raises(ValueError):
        sop_pairs(_corpus(2, 1), cls_id=CLS, sep_id=SEP, generator=step_generator(0, 0))


def test_nsp_pairs_by_hand():
    B, L = 200, 10
    content = _corpus(B, L)
    ids, types, labels = nsp_pairs(content, cls_id=CLS, sep_id=SEP, generator=step_generator(5, 6))
    for i in range(B):
        a, b = _split(ids[i])
        c = len(a)
        assert torch.equal(a, content[i, :c]), "A is always the start of the row"
        row_of_b = (b[0].item() - 5) // L
        if labels[i] == 0:  # IsNext: B is the true continuation
            assert torch.equal(b, content[i, c:])
        else:  # NotNext: the same stretch of another row
            assert row_of_b != i and torch.equal(b, content[row_of_b, c:])
        assert types[i].tolist() == [0] * (c + 2) + [1] * (L - c + 1)
    assert abs(labels.float().mean().item() - 0.5) < 0.12
