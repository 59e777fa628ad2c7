"""Jensen-Shannon head distances (Clark et al. 2019 sec. 6) on hand-made maps."""

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from probes.head_similarity import (HeadSimilarity, head_change_frame, head_distances, js_divergence,
                                    js_divergence_per_head, mds_embedding)
from probes.heads import Sentence


def random_rows(rng, L, H, n, k=2, temp=2.0):
    """Random attention (L, H, n, n) and special shares (L, H, n, k) whose rows sum to 1."""
    p = np.exp(rng.normal(size=(L, H, n, n + k)) * temp)
    p /= p.sum(-1, keepdims=True)
    return p[..., :n], p[..., n:]


def test_js_matches_scipy_reference_in_nats():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
    assert np.sqrt(js_divergence(p, q)) == pytest.approx(jensenshannon(p, q), rel=1e-9)


def test_identical_heads_zero_symmetric_and_bounded_by_sqrt_ln2():
    rng = np.random.default_rng(1)
    sents = []
    for n in (3, 6, 4):
        attn, spec = random_rows(rng, 2, 3, n)
        attn[1, 2], spec[1, 2] = attn[0, 1], spec[0, 1]                    # head (1, 2) copies head (0, 1)
        one = np.zeros((n, n + 2)); one[:, -1] = 1.0                        # head (0, 0): all on [SEP]
        other = np.zeros((n, n + 2)); other[:, 0] = 1.0                     # head (0, 2): all on word 0
        attn[0, 0], spec[0, 0] = one[:, :n], one[:, n:]
        attn[0, 2], spec[0, 2] = other[:, :n], other[:, n:]
        sents.append(Sentence(attn, spec))
    res = head_distances(sents)
    D = res.distance
    assert res.shape == (2, 3) and res.n_words == 13
    assert D[1, 5] == 0.0 and res.divergence[1, 5] == 0.0                 # flat index l * H + h
    assert np.array_equal(D, D.T) and np.all(np.diag(D) == 0)
    assert D[0, 2] == pytest.approx(np.sqrt(np.log(2)), rel=1e-6)        # disjoint supports: the maximum
    assert D.max() <= np.sqrt(np.log(2)) + 1e-6 and res.divergence.max() <= np.log(2) + 1e-6


def test_streaming_mean_equals_hand_average_over_words():
    rng = np.random.default_rng(2)
    sents = [random_rows(rng, 1, 2, n) for n in (2, 5)]
    got = head_distances(sents).divergence[0, 1]
    per_word = [js_divergence(np.concatenate([a[0, 0], s[0, 0]], -1), np.concatenate([a[0, 1], s[0, 1]], -1))
                for a, s in sents]
    assert got == pytest.approx(np.concatenate(per_word).mean(), rel=1e-5)


def test_max_words_caps_the_corpus():
    rng = np.random.default_rng(3)
    acc = HeadSimilarity(max_words=6)
    for n in (4, 4, 4):
        acc.update(*random_rows(rng, 1, 2, n))
    assert acc.finalize().n_words == 6 and acc.skipped_ == 1


def test_mds_places_identical_heads_together_and_is_seeded():
    D = np.array([[0.0, 0.0, 0.8, 0.8],
                  [0.0, 0.0, 0.8, 0.8],
                  [0.8, 0.8, 0.0, 0.1],
                  [0.8, 0.8, 0.1, 0.0]])
    emb = mds_embedding(D, seed=0)
    assert emb.shape == (4, 2)
    d = np.linalg.norm(emb[:, None] - emb[None], axis=-1)
    assert d[0, 1] < 0.05 and d[0, 2] > 0.5
    assert np.allclose(emb, mds_embedding(D, seed=0))


def test_same_head_across_models():
    rng = np.random.default_rng(4)
    a_sents = [random_rows(rng, 2, 2, n) for n in (3, 5)]
    b_sents = [(a.copy(), s.copy()) for a, s in a_sents]
    for a, s in b_sents:   # model b: head (1, 0) attends uniformly instead
        n = a.shape[-1]
        a[1, 0], s[1, 0] = 1 / (n + 2), 1 / (n + 2)
    js = js_divergence_per_head(a_sents, b_sents)
    assert js.shape == (2, 2)
    assert js[0, 0] == 0.0 and js[0, 1] == 0.0 and js[1, 1] == 0.0 and js[1, 0] > 0
    per_word = [js_divergence(np.concatenate(x, -1)[1, 0], np.concatenate(y, -1)[1, 0])
                for x, y in zip(a_sents, b_sents)]
    assert js[1, 0] == pytest.approx(np.concatenate(per_word).mean(), rel=1e-5)
    df = head_change_frame(js, "ft", "frozen")
    assert list(df.columns) == ["model_a", "model_b", "layer", "head", "metric", "value"]
    assert df.loc[(df["layer"] == 1) & (df["head"] == 0), "value"].item() == js[1, 0]
    with pytest.raises(ValueError, match="fewer sentences"):
        js_divergence_per_head(a_sents, b_sents[:1])


def test_rows_not_summing_to_one_raise():
    attn = np.full((1, 2, 3, 3), 0.3)
    with pytest.raises(ValueError, match="sentence 0.*layer 0, head 0"):
        HeadSimilarity().update(attn)
