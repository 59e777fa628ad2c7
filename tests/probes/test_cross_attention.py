"""probes.cross_attention on planted maps, and the denoising alignments it reads
(plmodels.training.denoising: `infilling_alignment`, `t5_sentinel_alignment`, return_alignment)."""
import numpy as np
import pytest
import torch

from plmodels.training.denoising import (
    bart_text_infilling,
    infill_spans,
    infilling_alignment,
    t5_sentinel_alignment,
    t5_span_corruption,
)
from probes.cross_attention import CrossAttentionStats, CrossSentence

L, H = 2, 4


def _planted(rng, T, S, align):
    """Random rows for every head; head (1, 2) puts 0.9 on the aligned source (uniform where none)."""
    A = rng.dirichlet(np.ones(S), size=(L, H, T))
    for t, a in enumerate(align):
        A[1, 2, t] = 0.1 / (S - 1) if a >= 0 else 1.0 / S
        if a >= 0:
            A[1, 2, t, a] = 0.9
    return A


def _sentences(n=60, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        S, T = rng.integers(8, 15), rng.integers(6, 12)
        align = np.sort(rng.choice(S, size=T, replace=True))  # monotonic, some positions unaligned
        align[rng.random(T) < 0.3] = -1
        out.append(CrossSentence(_planted(rng, T, S, align), align, sent_id=str(i)))
    return out


def _table(sentences, **kw):
    st = CrossAttentionStats(n_boot=200, **kw)
    for s in sentences:
        st.update(s)
    return st.finalize("m"), st


def test_a_planted_alignment_head_is_found_and_the_others_score_at_chance():
    sentences = _sentences()
    df, st = _table(sentences)
    assert list(df.columns) == ["model", "layer", "head", "score", "value"]
    assert len(df) == L * H * 6 and set(df.score) == {"align_acc", "align_acc:low", "align_acc:high", "align_mass",
                                                       "entropy", "monotonic"}  # no sentinels marked: no sentinel_acc
    v = df.set_index(["layer", "head", "score"])["value"]
    assert v[1, 2, "align_acc"] == 1.0 and v[1, 2, "monotonic"] == 1.0
    assert v[1, 2, "align_mass"] == pytest.approx(0.9)
    assert v[1, 2, "align_acc:low"] == 1.0 == v[1, 2, "align_acc:high"]
    chance = np.mean([1 / s.attn.shape[-1] for s in sentences])  # ~0.09
    others = [v[l, h, "align_acc"] for l in range(L) for h in range(H) if (l, h) != (1, 2)]
    assert max(others) < chance + 0.1 and min(others) > chance - 0.06, (others, chance)
    assert all(v[l, h, "monotonic"] < 0.75 for l in range(L) for h in range(H) if (l, h) != (1, 2))
    lows = [v[l, h, "align_acc:low"] for l in range(L) for h in range(H)]
    highs = [v[l, h, "align_acc:high"] for l in range(L) for h in range(H)]
    assert all(lo <= a <= hi for lo, a, hi in zip(lows, [v[l, h, "align_acc"] for l in range(L) for h in range(H)], highs))
    ent = df[df.score == "entropy"].value
    assert ((ent > 0) & (ent <= 1)).all() and v[1, 2, "entropy"] == ent.min()  # the peaked head is the sharpest


def test_monotonic_counts_successive_aligned_positions_and_sentinel_acc_only_sentinels():
    S = 5
    A = np.full((1, 1, 4, S), 0.1)
    for t, s in enumerate([3, 0, 1, 4]):  # argmax per target row
        A[0, 0, t, s] = 0.6
    align = np.array([3, -1, 1, 0])  # aligned rows 0, 2, 3: argmax 3, 1, 4 -> hits at rows 0 and 2
    sentinel = np.array([True, False, False, True])
    df = CrossAttentionStats(n_boot=0).update(CrossSentence(A, align, sentinel)).finalize("m")
    v = df.set_index("score")["value"]
    assert v["align_acc"] == pytest.approx(2 / 3)
    assert v["monotonic"] == pytest.approx(1 / 2)  # pairs (3 -> 1) decreases, (1 -> 4) does not
    assert v["sentinel_acc"] == pytest.approx(1 / 2)  # sentinels at rows 0 (hit) and 3 (miss)
    assert v["align_mass"] == pytest.approx((0.6 + 0.6 + 0.1) / 3)


def test_bad_inputs_are_refused():
    A = np.full((1, 1, 2, 3), 1 / 3)
    with pytest.raises(ValueError, match="alignment values"):
        CrossAttentionStats().update(CrossSentence(A, np.array([0, 3])))
    with pytest.raises(ValueError, match="sum to 1"):
        CrossAttentionStats().update(CrossSentence(A * 2, np.array([0, 1])))
    with pytest.raises(ValueError, match="no sentences"):
        CrossAttentionStats().finalize()


# ------------------------------------------------------------------------------ alignments


def test_bart_alignment_of_a_hand_made_infilling_is_the_walk_over_both_sequences():
    # [<s>=1, 10 .. 17, </s>=2]; span A covers 11 12 (-> <mask>=4), span B replaces 15 by a random id 99
    ids = torch.tensor([1, 10, 11, 12, 13, 14, 15, 16, 17, 2])
    out, covered = infill_spans(ids, torch.tensor([2, 6]), torch.tensor([2, 1]), mask_id=4,
                                random_ids=torch.tensor([-1, 99]))
    assert out.tolist() == [1, 10, 4, 13, 14, 99, 16, 17, 2]
    keep = torch.tensor([True, True, True, False, True, True, True, True, True, True])
    # one <mask> inserted at position 4 of the final input: [1, 10, 4, 13, <4>, 14, 99, 16, 17, 2]
    inserted = torch.zeros(10, dtype=torch.bool)
    inserted[4] = True
    align = infilling_alignment(keep, covered, inserted)
    assert align.tolist() == [0, 1, -1, -1, 3, 5, -1, 7, 8, 9]
    assert infilling_alignment(keep, covered).tolist() == [0, 1, -1, -1, 3, 4, -1, 6, 7, 8]
    # a sentence permutation: permuted token j is target token order[j]
    order = torch.tensor([0, 5, 6, 7, 8, 1, 2, 3, 4, 9])
    assert infilling_alignment(torch.ones(10, dtype=torch.bool), torch.zeros(10, dtype=torch.bool),
                               order=order).tolist() == [0, 5, 6, 7, 8, 1, 2, 3, 4, 9]


@pytest.mark.parametrize("permute", [False, True])
def test_bart_return_alignment_keeps_the_draws_and_points_at_surviving_copies(permute):
    g = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.tensor([1]), torch.randint(10, 50, (40,), generator=g), torch.tensor([2])])
    ends = torch.zeros(42, dtype=torch.bool)
    ends[[10, 25]] = True
    for seed in range(20):
        kw = dict(mask_id=4, random_ratio=0.2, vocab_size=60, permute_sentences=permute, sentence_ends=ends)
        plain = bart_text_infilling(ids, generator=torch.Generator().manual_seed(seed), **kw)
        noised = bart_text_infilling(ids, generator=torch.Generator().manual_seed(seed), return_alignment=True, **kw)
        assert plain.alignment is None and torch.equal(plain.inputs, noised.inputs)
        a = noised.alignment
        hit = a >= 0
        assert torch.equal(noised.inputs[a[hit]], ids[hit])  # every aligned target token is its own copy
        assert int(hit.sum()) == int((~noised.masked).sum())  # every uncovered token survives exactly once
        assert len(set(a[hit].tolist())) == int(hit.sum())
        if not permute:
            assert bool((a[hit].diff() > 0).all())  # monotonic


def test_t5_sentinel_alignment_pairs_each_target_sentinel_with_the_input_one():
    # sentinels <extra_id_0> = 99, <extra_id_1> = 98; EOS = 2; noise spans: 11 12 and 15
    ids = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    noise = torch.tensor([False, True, True, False, False, True, False])
    c = t5_span_corruption(ids, sentinel_ids=[99, 98, 97], eos_id=2, noise_mask=noise, return_alignment=True)
    assert c.inputs.tolist() == [10, 99, 13, 14, 98, 16, 2]
    assert c.targets.tolist() == [99, 11, 12, 98, 15, 97, 2]
    assert c.alignment.tolist() == [1, -1, -1, 4, -1, -1, -1]  # <extra_id_2> opens no input span: none
    assert t5_span_corruption(ids, sentinel_ids=[99, 98, 97], eos_id=2, noise_mask=noise).alignment is None
    assert t5_sentinel_alignment(c.inputs, c.targets, [99, 98, 97]).tolist() == c.alignment.tolist()
