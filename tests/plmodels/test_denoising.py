"""Tests for T5's span corruption and BART's text infilling (plmodels/training/denoising.py)."""
import itertools
import math
from collections import Counter

import pytest
import torch

from plmodels.training.denoising import (
    _random_segmentation,
    bart_text_infilling,
    infill_spans,
    insert_noise,
    noise_span_to_unique_sentinel,
    poisson_span_probs,
    random_spans_noise_mask,
    t5_sentinel_ids,
    t5_span_corruption,
)

V, EOS = 200, 1
SENTINELS = t5_sentinel_ids(V)  # 199, 198, ...
BOS, BEOS, MASK = 0, 2, 3  # BART's <s>, </s>, <mask>


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    runs, s = [], None
    for t, m in enumerate(mask + [False]):
        if m and s is None:
            s = t
        if not m and s is not None:
            runs.append((s, t - 1))
            s = None
    return runs


def _f32_round(a: float, b: float, op=torch.mul) -> int:
    """tf.round(float32(a) op float32(b))."""
    return int(torch.round(op(torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32))))


# ------------------------------------------------------------------------------------------ T5


def test_t5_hand_made_example():
    """"Thank you <for inviting> me to your party <last> week": ids 5..14, noise at 2, 3 and 8."""
    ids = torch.arange(5, 15)
    mask = torch.zeros(10, dtype=torch.bool)
    mask[[2, 3, 8]] = True
    out = t5_span_corruption(ids, sentinel_ids=SENTINELS, eos_id=EOS, noise_mask=mask)
    assert out.inputs.tolist() == [5, 6, 199, 9, 10, 11, 12, 198, 14, EOS]
    # T5's nonnoise_span_to_unique_sentinel: every kept run becomes a sentinel, so a kept tail gets one too
    assert out.targets.tolist() == [199, 7, 8, 198, 13, 197, EOS]


def test_t5_sentinels_count_down():
    ids = torch.arange(5, 11)
    mask = torch.tensor([False, True, False, True, False, True])
    assert noise_span_to_unique_sentinel(ids, mask, [90, 80, 70]).tolist() == [5, 90, 7, 80, 9, 70]
    with pytest.raises(ValueError, match="sentinel"):
        noise_span_to_unique_sentinel(ids, mask, [90, 80])


def _reconstruct(inputs: list[int], targets: list[int]) -> list[int]:
    spans, current = {}, None
    for t in targets[:-1]:
        if t in SENTINELS:
            current = spans.setdefault(t, [])
        else:
            current.append(t)
    out = []
    for t in inputs[:-1]:
        out += spans[t] if t in SENTINELS else [t]
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 30, 64, 113, 190, 512])
def test_t5_reconstructs_and_follows_the_formulas(n):
    g = torch.Generator().manual_seed(n)
    for _ in range(20):
        ids = torch.randint(5, 100, (n,), generator=g)  # below the sentinels (199..100)
        out = t5_span_corruption(ids, sentinel_ids=SENTINELS, eos_id=EOS, generator=g)
        assert out.inputs[-1] == EOS and out.targets[-1] == EOS
        assert out.targets[0] == SENTINELS[0]  # T5 starts with kept tokens: targets start with <extra_id_0>
        assert _reconstruct(out.inputs.tolist(), out.targets.tolist()) == ids.tolist()
        m = max(n, 2)
        num_noise = min(max(_f32_round(m, 0.15), 1), m - 1)
        num_spans = max(_f32_round(num_noise, 3.0, torch.div), 1)
        runs = _runs(out.noise_mask.tolist())
        if n >= 2:
            assert int(out.noise_mask.sum()) == num_noise
            assert len(runs) == num_spans
            assert not out.noise_mask[0] and out.noise_mask[-1]  # kept first, noise last
        assert len(out.inputs) == n - int(out.noise_mask.sum()) + len(runs) + 1


def test_t5_rounding_is_tf_round_in_float32():
    """190 * 0.15 is 28.5 in float64 (half to even: 28) but 28.500002 in float32 (tf.round: 29)."""
    mask = random_spans_noise_mask(190, 0.15, generator=torch.Generator().manual_seed(0))
    assert int(mask.sum()) == 29
    mask = random_spans_noise_mask(30, 0.15, generator=torch.Generator().manual_seed(0))
    assert int(mask.sum()) == 4  # 4.5 in float32 too: half to even


def test_t5_mean_span_length_is_about_three():
    g = torch.Generator().manual_seed(0)
    lengths = []
    for _ in range(300):
        n = int(torch.randint(100, 600, (1,), generator=g))
        lengths += [e - s + 1 for s, e in _runs(random_spans_noise_mask(n, generator=g).tolist())]
    assert abs(sum(lengths) / len(lengths) - 3.0) < 0.1
    assert max(lengths) > 6  # random segmentation, not fixed-length spans


def test_t5_segmentation_is_uniform_over_compositions():
    """6 tokens in 3 non-empty spans: C(5, 2) = 10 compositions, each with probability 1/10."""
    g = torch.Generator().manual_seed(0)
    counts = Counter(tuple(_random_segmentation(6, 3, g).tolist()) for _ in range(5000))
    assert len(counts) == 10 and all(sum(c) == 6 and min(c) >= 1 for c in counts)
    assert all(abs(k / 5000 - 0.1) < 0.02 for k in counts.values())


def test_t5_too_dense_is_an_error():
    with pytest.raises(ValueError, match="spans"):
        random_spans_noise_mask(10, 0.9, mean_span_length=1.0, generator=torch.Generator())


# ---------------------------------------------------------------------------------------- BART

IDS = torch.tensor([BOS, 10, 11, 12, 13, 14, 15, 16, 17, BEOS])


def test_bart_hand_made_spans():
    out, covered = infill_spans(IDS, torch.tensor([2, 6]), torch.tensor([2, 1]), mask_id=MASK,
                                random_ids=torch.tensor([-1, 50]))
    assert out.tolist() == [BOS, 10, MASK, 13, 14, 50, 16, 17, BEOS]  # span 11 12 -> <mask>; 15 -> random 50
    assert covered.nonzero().squeeze(1).tolist() == [2, 3, 6]


def test_bart_overlapping_and_end_spans():
    # the second span starts inside the first: its start is deleted with it, one <mask> for the union
    out, _ = infill_spans(IDS, torch.tensor([2, 3]), torch.tensor([3, 2]), mask_id=MASK)
    assert out.tolist() == [BOS, 10, MASK, 14, 15, 16, 17, BEOS]
    # a span never runs over </s>
    out, _ = infill_spans(IDS, torch.tensor([7]), torch.tensor([9]), mask_id=MASK)
    assert out.tolist() == [BOS, 10, 11, 12, 13, 14, 15, MASK, BEOS]


def test_bart_whole_word_spans():
    starts = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1, 0], dtype=torch.bool)  # words: 10 | 11 12 | 13 14 15 | 16 | 17
    out, _ = infill_spans(IDS, torch.tensor([4]), torch.tensor([1]), mask_id=MASK, word_starts=starts)
    assert out.tolist() == [BOS, 10, 11, 12, MASK, 16, 17, BEOS]  # one word = three pieces
    out, _ = infill_spans(IDS, torch.tensor([2]), torch.tensor([2]), mask_id=MASK, word_starts=starts)
    assert out.tolist() == [BOS, 10, MASK, 16, 17, BEOS]  # two words


def test_bart_insertions():
    g = torch.Generator().manual_seed(0)
    out = insert_noise(IDS, 3, mask_id=MASK, random_ratio=0.1, vocab_size=V, generator=g)
    assert len(out) == len(IDS) + 3 and out[0] == BOS and out[-1] == BEOS
    assert int((out == MASK).sum()) == 2  # ceil(3 * 0.1) = 1 insertion is a random id (fairseq)
    out = insert_noise(IDS, 4, mask_id=MASK, random_ratio=0.0, vocab_size=V, generator=g)
    assert out[out != MASK].tolist() == IDS.tolist() and int((out == MASK).sum()) == 4  # order kept


def test_poisson_probs_are_fairseqs_truncation():
    ps = poisson_span_probs(3.0)
    assert ps[-1] < 1e-7 <= ps[-2]
    assert torch.allclose(ps[:4], torch.tensor([math.exp(-3) * 3**k / math.factorial(k) for k in range(4)]))


def test_bart_statistics_over_many_draws():
    g = torch.Generator().manual_seed(0)
    T = 202  # 200 maskable tokens: budget ceil(0.3 * 200) = 60
    ids = torch.cat([torch.tensor([BOS]), torch.randint(10, V, (T - 2,), generator=g), torch.tensor([BEOS])])
    lengths, fractions = [], []
    for _ in range(400):
        out = bart_text_infilling(ids, mask_id=MASK, generator=g, vocab_size=V)
        assert torch.equal(out.targets, ids)
        assert sum(out.span_lengths) == 60  # the budget is met exactly
        assert out.inputs[0] == BOS and out.inputs[-1] == BEOS
        lengths += out.span_lengths[:-1]  # the last one is cut to the budget
        fractions.append(float(out.masked.float().sum()) / (T - 2))
        # one token per surviving span start (>= one per covered run; starts inside other spans vanish)
        runs, inserts = len(_runs(out.masked.tolist())), out.span_lengths.count(0)
        assert T - int(out.masked.sum()) + runs + inserts <= len(out.inputs) <= T - int(out.masked.sum()) + len(out.span_lengths)
    mean_fraction = sum(fractions) / len(fractions)
    assert 0.25 < mean_fraction <= 0.3  # overlapping spans cover a little under the 0.3 budget
    assert abs(sum(lengths) / len(lengths) - 3.0) < 0.1
    freq = Counter(lengths)
    for k in range(7):  # Poisson(3) frequencies
        assert abs(freq[k] / len(lengths) - math.exp(-3) * 3**k / math.factorial(k)) < 0.02


def test_bart_random_ratio():
    g = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.tensor([BOS]), torch.full((300,), 7), torch.tensor([BEOS])])
    n_mask = n_random = 0
    for _ in range(100):
        out = bart_text_infilling(ids, mask_id=MASK, generator=g, vocab_size=V, poisson_lambda=3.0)
        new = out.inputs[1:-1][out.inputs[1:-1] != 7]
        n_mask += int((new == MASK).sum())
        n_random += int((new != MASK).sum())
    assert abs(n_random / (n_mask + n_random) - 0.1) < 0.03


def test_bart_sentence_permutation_keeps_the_sentences():
    stop = 9
    ids = torch.tensor([BOS, 10, 11, stop, 12, stop, 13, 14, 15, stop, 16, 17, BEOS])
    sentences = [(10, 11, 9), (12, 9), (13, 14, 15, 9), (16, 17)]
    concatenations = {sum((sentences[i] for i in order), ()): order for order in itertools.permutations(range(4))}
    g = torch.Generator().manual_seed(0)
    orders = set()
    for _ in range(50):
        out = bart_text_infilling(ids, mask_ratio=0.0, mask_id=MASK, generator=g, permute_sentences=True,
                                  sentence_ends=ids == stop, random_ratio=0.0)
        assert torch.equal(out.targets, ids)
        assert out.inputs[0] == BOS and out.inputs[-1] == BEOS and len(out.inputs) == len(ids)
        orders.add(concatenations[tuple(out.inputs[1:-1].tolist())])  # KeyError if not a reordering
    assert len(orders) > 12  # a random order each draw, not a fixed one (all 24 are equally likely)
