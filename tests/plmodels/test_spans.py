"""Tests for SpanBERT's span masking and span-boundary head (plmodels/training/spans.py)."""
import math

import pytest
import torch
from scipy import stats

from plmodels.training.masking import IGNORE_INDEX, step_generator, word_starts
from plmodels.training.spans import SpanBoundaryHead, sbo_targets, span_length_probs, span_mask

V, PAD, CLS, SEP, MASK = 1000, 0, 2, 3, 4
SPECIALS = {0, 1, 2, 3, 4}
CONT = torch.arange(600, V)  # ids 600.. are "##" continuation pieces (about 2 in 5 tokens)


def _batch(B=32, T=128, seed=0):
    """[CLS] A [SEP] B [SEP] [PAD]...: a middle [SEP] and a continuation piece right after it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0], ids[:, 60], ids[:, 61], ids[:, -10] = CLS, SEP, 700, SEP
    ids[:, -9:] = PAD
    return ids


def _mask(ids, seed=0, **kw):
    return span_mask(ids, starts=word_starts(ids, CONT), mask_id=MASK, vocab_size=V, special_ids=SPECIALS,
                     generator=step_generator(seed, 0), **kw)


def _runs(row_masked):
    """Maximal runs [s, e] of True in a list of bools (the spans, as merged)."""
    runs, s = [], None
    for t, m in enumerate(row_masked + [False]):
        if m and s is None:
            s = t
        if not m and s is not None:
            runs.append((s, t - 1))
            s = None
    return runs


@pytest.fixture(scope="module")
def draws():
    """Forty batches of masks over the same kind of rows (about 5000 spans)."""
    return [(ids, _mask(ids, seed=i)) for i in range(40) for ids in [_batch(seed=i)]]


def test_span_length_probs_by_hand():
    w = [0.2 * 0.8 ** k for k in range(10)]
    torch.testing.assert_close(span_length_probs(), torch.tensor(w, dtype=torch.float64) / sum(w))
    assert span_length_probs(0.2, 10)[0].item() == pytest.approx(0.2 / (1 - 0.8 ** 10))


def test_sampled_lengths_follow_the_law_and_a_wrong_law_is_rejected(draws):
    lengths = torch.tensor([L for _, m in draws for L in m.span_lengths])
    assert len(lengths) > 3000
    observed = torch.bincount(lengths - 1, minlength=10).double()
    assert len(observed) == 10, "a span length outside 1..10 was drawn"
    n = observed.sum()
    bound = stats.chi2.ppf(0.999, df=9)
    chi2 = lambda probs: (((observed - n * probs) ** 2) / (n * probs)).sum().item()
    assert chi2(span_length_probs(0.2)) < bound
    assert chi2(span_length_probs(0.4)) > bound   # the same test tells p=0.4 apart
    assert chi2(span_length_probs(0.25)) > bound  # and a near miss


def test_budget_whole_words_and_specials(draws):
    cont_ids = set(CONT.tolist())
    for ids, m in draws[:10]:
        sel = m.labels != IGNORE_INDEX
        special = torch.isin(ids, torch.tensor(sorted(SPECIALS)))
        assert not (sel & special).any(), "a special token was masked"
        assert torch.equal(m.input_ids[special], ids[special])
        assert torch.equal(m.labels[sel], ids[sel]) and torch.equal(m.input_ids[~sel], ids[~sel])
        for b in range(ids.shape[0]):
            row, s = ids[b].tolist(), sel[b].tolist()
            budget = math.ceil(0.15 * (~special[b]).sum().item())
            # whole words: a continuation piece (not after a special) is masked iff the token before is
            longest_word, run = 1, 1
            for t in range(1, len(row)):
                cont = row[t] in cont_ids and row[t - 1] not in SPECIALS
                if cont:
                    assert s[t] == s[t - 1], f"row {b}: word cut at {t}"
                run = run + 1 if cont else 1
                longest_word = max(longest_word, run)
            # the budget is met, and overrun only to finish the last word
            assert budget <= sum(s) < budget + longest_word
    share = sum((m.labels != IGNORE_INDEX).sum().item() for _, m in draws) / sum(
        (~torch.isin(ids, torch.tensor(sorted(SPECIALS)))).sum().item() for ids, _ in draws)
    # the continuation piece right after the middle [SEP] starts a word of its own, so it can be masked
    assert sum((m.labels[:, 61] != IGNORE_INDEX).sum().item() for _, m in draws) > 50
    # ceil(15% of 109 real tokens) = 17 is 15.6%, and finishing the last word adds about half a token
    assert 0.15 <= share < 0.17


def test_boundaries_and_relative_positions_are_the_span_neighbours(draws):
    for ids, m in draws[:10]:
        sel = (m.labels != IGNORE_INDEX)
        T = ids.shape[1]
        assert (m.left[~sel] == -1).all() and (m.right[~sel] == -1).all() and (m.rel_pos[~sel] == -1).all()
        for b in range(ids.shape[0]):
            for s, e in _runs(sel[b].tolist()):
                assert m.left[b, s:e + 1].tolist() == [s - 1] * (e - s + 1)
                assert m.right[b, s:e + 1].tolist() == [e + 1 if e + 1 < T else -1] * (e - s + 1)
                assert m.rel_pos[b, s:e + 1].tolist() == list(range(e - s + 1))
                assert ids[b, s - 1].item() != PAD  # spans stop at specials, so a boundary is real or [CLS]/[SEP]


def test_replacement_is_decided_per_span(draws):
    counts = {"mask": 0, "random": 0, "keep": 0}
    for ids, m in draws:
        sel = m.labels != IGNORE_INDEX
        for b in range(ids.shape[0]):
            for s, e in _runs(sel[b].tolist()):
                new, old = m.input_ids[b, s:e + 1], ids[b, s:e + 1]
                if (new == MASK).all():
                    counts["mask"] += 1
                elif torch.equal(new, old):
                    counts["keep"] += 1
                else:  # random: no token of the span is [MASK] or any other special
                    assert not torch.isin(new, torch.tensor(sorted(SPECIALS))).any(), (b, s, e, new)
                    assert (new != old).float().mean() > 0.5, "a random span must be replaced throughout"
                    counts["random"] += 1
    n = sum(counts.values())
    assert n > 3000
    assert abs(counts["mask"] / n - 0.8) < 0.03
    assert abs(counts["random"] / n - 0.1) < 0.025 and abs(counts["keep"] / n - 0.1) < 0.025


def test_same_generator_same_masks_and_sbo_targets_in_label_order(draws):
    ids, m = draws[0]
    again = _mask(ids, seed=0)
    assert torch.equal(m.input_ids, again.input_ids) and m.span_lengths == again.span_lengths
    assert not torch.equal(m.labels, _mask(ids, seed=1).labels)
    _, left, right, rel_pos, targets = sbo_targets(m)
    sel = m.labels != IGNORE_INDEX
    assert torch.equal(m.sbo, sel & (m.rel_pos < 15)), "every span here has both boundaries"
    assert torch.equal(targets, m.labels[m.sbo]) and torch.equal(targets, ids[m.sbo])
    assert torch.equal(rel_pos, m.rel_pos[m.sbo]) and (left >= 0).all() and (right > left).all()


def test_long_spans_are_cut_to_max_pair_targets_for_sbo():
    ids = torch.randint(5, 600, (2, 40), generator=torch.Generator().manual_seed(0))  # whole words only
    ids[:, 0], ids[:, 30], ids[:, 31:] = CLS, SEP, PAD
    m = _mask(ids, rate=1.0, max_pair_targets=5)  # every real token is masked: spans 1..29
    assert (m.labels[:, 1:30] == ids[:, 1:30]).all() and (m.labels[:, 30:] == IGNORE_INDEX).all()
    assert m.rel_pos[0, 1:30].tolist() == list(range(29))
    assert (m.left[:, 1:30] == 0).all() and (m.right[:, 1:30] == 30).all()
    assert m.sbo[:, 1:6].all() and not m.sbo[:, 6:].any()
    assert len(sbo_targets(m)[0]) == 10


def test_span_boundary_head_reads_only_the_boundaries_and_position():
    torch.manual_seed(0)
    D, E, B, T = 16, 8, 2, 12
    head = SpanBoundaryHead(D, E, max_pair_targets=15).eval()
    assert head.position.weight.shape == (15, 200) and head.dense1.in_features == 2 * D + 200
    assert torch.all(head.dense1.bias == 0) and abs(head.dense1.weight.std().item() - 0.02) < 0.003
    hidden = torch.randn(B, T, D)
    batch_index, left, right = torch.tensor([0, 0, 1]), torch.tensor([2, 2, 0]), torch.tensor([6, 6, 4])
    rel_pos = torch.tensor([0, 3, 1])
    out = head(hidden, left, right, rel_pos, batch_index)
    assert out.shape == (3, E)
    # by hand: LN(GeLU(W2 LN(GeLU(W1 [x_l; x_r; p])))) with the LayerNorms at init (gain 1, bias 0)
    x = torch.cat([hidden[batch_index, left], hidden[batch_index, right], head.position.weight[rel_pos]], -1)
    ln = lambda h: torch.nn.functional.layer_norm(h, h.shape[-1:], eps=1e-12)
    ref = ln(torch.nn.functional.gelu(head.dense2(ln(torch.nn.functional.gelu(head.dense1(x))))))
    torch.testing.assert_close(out, ref)
    assert not torch.allclose(out[0], out[1]), "the position inside the span must matter"
    inside = hidden.clone()
    inside[0, 3:6] += 5.0  # the tokens of the first span, between its boundaries 2 and 6
    inside[1, 1:4] += 5.0
    torch.testing.assert_close(head(inside, left, right, rel_pos, batch_index), out, rtol=0, atol=0)
    moved = hidden.clone()
    moved[0, 2] += 1.0  # the first span's left boundary
    changed = head(moved, left, right, rel_pos, batch_index)
    assert not torch.allclose(changed[:2], out[:2]) and torch.equal(changed[2], out[2])
    with pytest.raises(ValueError, match="activation"):
        SpanBoundaryHead(D, E, activation="swish")
