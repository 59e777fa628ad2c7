"""Edge probe: pooling by hand, planted signals, two-span relations, input errors, determinism."""
import numpy as np
import pytest
import torch

from probes.edge import EdgeProbe, LinearProbe, SpanProbeModule, micro_f1
from probes.pooling import POOLERS, make_pooler
from probes.scalar_mix import ScalarMix




FAST = dict(proj_dim=16, hidden=32, lr=1e-2, batch_size=128, max_epochs=15, patience=3)


def _h_and_mask():
    h = torch.tensor([[[1., 2.], [3., -1.], [5., 0.]],
                      [[-2., 4.], [99., 99.], [99., 99.]]])  # span 2 has one real token + padding
    mask = torch.tensor([[True, True, True], [True, False, False]])
    return h, mask


@pytest.mark.parametrize("name,expected", [
    ("mean", [[3., 1 / 3], [-2., 4.]]),
    ("max", [[5., 2.], [-2., 4.]]),
    ("last", [[5., 0.], [-2., 4.]]),
    ("endpoint", [[1., 2., 5., 0.], [-2., 4., -2., 4.]]),
])
def test_pooling_by_hand(name, expected):
    h, mask = _h_and_mask()
    torch.testing.assert_close(make_pooler(name, 2)(h, mask), torch.tensor(expected))


def test_self_attentive_weights_sum_to_one_and_ignore_padding():
    torch.manual_seed(0)
    pool = make_pooler("self_attn", 2)
    h, mask = _h_and_mask()
    alpha = pool.attention_weights(h, mask)
    torch.testing.assert_close(alpha.sum(1), torch.ones(2))
    assert torch.all(alpha[1, 1:] == 0) and alpha[1, 0] == 1
    h2 = h.clone()
    h2[1, 1:] = -1234.0  # padding values must not matter
    torch.testing.assert_close(pool(h, mask), pool(h2, mask))
    manual = (torch.softmax(pool.score(h[0]).squeeze(-1), 0)[:, None] * h[0]).sum(0)
    torch.testing.assert_close(pool(h, mask)[0], manual)


def test_unknown_pooling_lists_choices():
    with pytest.raises(ValueError, match="self_attn"):
        make_pooler("median", 4)


def test_scalar_mix_by_hand():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.logits.copy_(torch.log(torch.tensor([0.1, 0.2, 0.7])))
        mix.gamma.fill_(2.0)
    x = torch.tensor([[[1., 0.], [0., 1.], [1., 1.]]])  # (B=1, K=3, D=2)
    torch.testing.assert_close(mix(x), torch.tensor([[2 * (0.1 + 0.7), 2 * (0.2 + 0.7)]]))


@pytest.mark.parametrize("pooling", sorted(POOLERS))
def test_linear_pool_first_equals_project_then_pool(pooling):
    """The pool-before-projection shortcut gives the same span vectors as Tenney's order."""
    torch.manual_seed(0)
    m = SpanProbeModule(3, 6, 1, 2, pooling, "mlp", 8, 0.0, 4)
    x, mask = torch.randn(5, 4, 3, 6), torch.arange(4)[None] < torch.tensor([1, 2, 3, 4, 2])[:, None]
    ref = m.pool[0](m.proj[0](m.mix(x)), mask)
    torch.testing.assert_close(m.encode(0, x, mask), ref)


def _store(n_words=3000, d=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n_words, d)).astype(np.float16)


def _single_word_task(X, n=1500, seed=1):
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(X), n, replace=False)
    span = np.stack([rows, rows + 1], 1)
    y = np.where(X[rows, 0].astype(float) + X[rows, 1] > 0, "A", "B")
    return span, y


@pytest.mark.parametrize("pooling", ["mean", "self_attn", "max", "last", "endpoint"])
def test_recovers_planted_linear_signal(pooling):
    X = _store()
    span, y = _single_word_task(X)
    p = EdgeProbe(pooling=pooling, **FAST).fit(X, y[:1000], span[:1000])
    s = p.score(X, y[1000:], span[1000:])
    assert s["accuracy"] > 0.9 and s["micro_f1"] == s["accuracy"]
    assert list(p.classes_) == ["A", "B"]


def test_linear_probe_and_memmap_float16(tmp_path):
    X = _store()
    mm = np.lib.format.open_memmap(tmp_path / "layer_0.npy", mode="w+", dtype=np.float16, shape=X.shape)
    mm[:] = X
    span, y = _single_word_task(X)
    p = LinearProbe(max_epochs=20).fit(mm, y[:1000], span[:1000])
    assert p.score(mm, y[1000:], span[1000:])["accuracy"] > 0.9


def test_two_span_relation_needs_both_spans():
    """Label = whether the two spans' words come from the same of 4 clusters."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((4, 12)) * 2
    cluster = rng.integers(0, 4, 4000)
    X = (centers[cluster] + 0.3 * rng.standard_normal((4000, 12))).astype(np.float16)
    a, b = rng.integers(0, 4000, 3000), rng.integers(0, 4000, 3000)
    same = rng.random(3000) < 0.5  # make half the pairs same-cluster
    for i in np.flatnonzero(same):
        b[i] = rng.choice(np.flatnonzero(cluster == cluster[a[i]]))
    s1, s2 = np.stack([a, a + 1], 1), np.stack([b, b + 1], 1)
    y = (cluster[a] == cluster[b]).astype(int)
    both = EdgeProbe(pooling="mean", **{**FAST, "hidden": 64, "max_epochs": 30}).fit(X, y[:2000], s1[:2000], s2[:2000])
    one = EdgeProbe(pooling="mean", **{**FAST, "hidden": 64, "max_epochs": 30}).fit(X, y[:2000], s1[:2000])
    assert both.score(X, y[2000:], s1[2000:], s2[2000:])["accuracy"] > 0.9
    assert one.score(X, y[2000:], s1[2000:])["accuracy"] < 0.65


def test_unseen_labels_and_bad_spans_raise():
    X = _store(200)
    span = np.stack([np.arange(100), np.arange(100) + 1], 1)
    y = np.array(["A", "B"] * 50)
    p = EdgeProbe(max_epochs=1, **{k: v for k, v in FAST.items() if k != "max_epochs"}).fit(X, y, span)
    with pytest.raises(ValueError, match="ZZZ"):
        p.score(X, np.array(["A", "ZZZ"] * 50), span)
    with pytest.raises(ValueError, match="outside"):
        p.predict(X, np.array([[199, 201]]))
    with pytest.raises(ValueError, match="outside"):
        EdgeProbe().fit(X, ["A"], np.array([[-1, 1]]))
    with pytest.raises(ValueError, match="empty"):
        p.predict(X, np.array([[5, 5]]))
    with pytest.raises(ValueError, match="2 span"):
        EdgeProbe(max_epochs=1).fit(X, y, span, span).predict(X, span)


def test_features_of_another_width_or_depth_are_refused_naming_both():
    """A probe fitted on one layer of width 8 refuses a store of width 5 (one layer, as a single-layer
    store reaches it) or of two layers, naming what it got and what it was fitted on."""
    rng = np.random.default_rng(0)
    span = np.stack([np.arange(40), np.arange(40) + 1], 1)
    y = np.array(["A", "B"] * 20)
    p = EdgeProbe(max_epochs=1, **{k: v for k, v in FAST.items() if k != "max_epochs"}).fit(
        rng.normal(size=(41, 8)).astype(np.float32), y, span)
    with pytest.raises(ValueError, match=r"got 1 layers of width 5, the probe was fitted on 1 layers of width 8"):
        p.predict(rng.normal(size=(41, 5)).astype(np.float32), span)
    with pytest.raises(ValueError, match=r"got 2 layers of width 8, the probe was fitted on 1 layers of width 8"):
        p.predict(rng.normal(size=(2, 41, 8)).astype(np.float32), span)


def test_determinism_for_fixed_seed():
    X = _store()
    span, y = _single_word_task(X, n=600)
    a = EdgeProbe(pooling="self_attn", seed=3, **FAST).fit(X, y, span).predict_proba(X, span)
    b = EdgeProbe(pooling="self_attn", seed=3, **FAST).fit(X, y, span).predict_proba(X, span)
    c = EdgeProbe(pooling="self_attn", seed=4, **FAST).fit(X, y, span).predict_proba(X, span)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_mix_input_forms_agree_and_weights_exposed():
    rng = np.random.default_rng(0)
    X3 = rng.standard_normal((3, 800, 8)).astype(np.float16)
    span = np.stack([np.arange(0, 790, 2), np.arange(0, 790, 2) + 2], 1)
    y = (X3[1, span[:, 0], 0] > 0).astype(int)
    a = EdgeProbe(pooling="mean", **FAST).fit(X3, y, span)
    b = EdgeProbe(pooling="mean", **FAST).fit([X3[0], X3[1], X3[2]], y, span)
    np.testing.assert_allclose(a.mix_weights_, b.mix_weights_)
    assert a.mix_weights_.shape == (3,) and np.isclose(a.mix_weights_.sum(), 1)
    assert not hasattr(EdgeProbe(max_epochs=1).fit(X3[0], y, span), "mix_weights_")


def test_multilabel_sigmoid_outputs_and_micro_f1():
    X = _store()
    span, y = _single_word_task(X)
    ym = [("A", "pos0") if v == "A" else ("B",) for v in y]
    p = EdgeProbe(pooling="mean", multilabel=True, **FAST).fit(X, ym[:1000], span[:1000])
    assert list(p.classes_) == ["A", "B", "pos0"]
    proba = p.predict_proba(X, span[1000:])
    assert proba.shape == (500, 3) and not np.allclose(proba.sum(1), 1)
    pred = p.predict(X, span[1000:])
    assert set(np.unique(pred)) <= {0, 1}
    s = p.score(X, ym[1000:], span[1000:])
    assert s["micro_f1"] > 0.9 and s["accuracy"] > 0.85
    # micro-F1 by hand: TP=2, FP=1, FN=1 -> 4 / 6
    assert micro_f1(np.array([[1, 0], [1, 1]]), np.array([[1, 1], [1, 0]])) == pytest.approx(2 / 3)


def test_explicit_validation_set_and_early_stopping_restores_best():
    X = _store()
    span, y = _single_word_task(X)
    p = EdgeProbe(pooling="mean", **{**FAST, "max_epochs": 30, "patience": 2}).fit(
        X, y[:800], span[:800], X_val=X, y_val=y[800:1000], span1_val=span[800:1000])
    assert len(p.history_) == p.n_epochs_ and p.best_epoch_ == int(np.argmin(p.history_))
    assert p.n_epochs_ < 30 or p.best_epoch_ >= 28  # stopped early unless still improving
    # the restored module gives the best validation loss again
    proba = p.predict_proba(X, span[800:1000])
    idx = np.searchsorted(p.classes_, y[800:1000])
    nll = -np.mean(np.log(proba[np.arange(200), idx]))
    assert nll == pytest.approx(min(p.history_), rel=1e-3)


def _scaled_task(seed=0, n_words=600):
    """Label = sign of feature 0 (unit scale) next to 15 nuisance features; spans of 1-3 words."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_words, 16)).astype(np.float32)
    starts = rng.integers(0, n_words - 3, 300)
    spans = np.stack([starts, starts + rng.integers(1, 4, 300)], 1)
    y = np.array(["pos" if X[a:b, 0].mean() > 0 else "neg" for a, b in spans])
    return X, y, spans


@pytest.mark.parametrize("pooling", ["mean", "self_attn"])
def test_standardize_makes_the_probe_blind_to_each_layers_scale(pooling):
    """z-scored inputs: a layer multiplied by 300 and shifted by 5 gives the same probe. (Up to the
    precision of the float16 cache of pre-pooled spans: a shift far above a layer's spread would
    round its values away, as a float16 store would.)"""
    X, y, spans = _scaled_task()
    stacked = np.stack([X, X[::-1].copy()])  # two layers: the scalar mix path too
    scale, shift = np.array([300.0, 0.01], dtype=np.float32), np.array([5.0, 0.0], dtype=np.float32)
    moved = stacked * scale[:, None, None] + shift[:, None, None]
    for Xa, Xb in ((X, 300.0 * X + 5.0), (stacked, moved)):
        a = EdgeProbe(pooling=pooling, standardize=True, seed=0, **FAST).fit(Xa, y, spans)
        b = EdgeProbe(pooling=pooling, standardize=True, seed=0, **FAST).fit(Xb, y, spans)
        # equal up to float32 rounding carried through training
        np.testing.assert_allclose(a.predict_proba(Xa, spans), b.predict_proba(Xb, spans), atol=2e-3)
        assert a.score(Xa, y, spans)["accuracy"] > 0.85
        raw_a = EdgeProbe(pooling=pooling, seed=0, **FAST).fit(Xa, y, spans).predict_proba(Xa, spans)
        raw_b = EdgeProbe(pooling=pooling, seed=0, **FAST).fit(Xb, y, spans).predict_proba(Xb, spans)
        assert np.abs(raw_a - raw_b).max() > 0.05  # without it, the scale changes the probe


def test_standardize_moments_are_those_of_the_covered_words():
    X, y, spans = _scaled_task(seed=1)
    covered = np.unique(np.concatenate([np.arange(a, b) for a, b in spans]))
    X[np.setdiff1d(np.arange(len(X)), covered)] = 1e6  # words no span covers must not count
    X[:, 3] = 2.5                                       # a constant feature gets scale 1
    p = LinearProbe(standardize=True, max_epochs=2).fit(X, y, spans)
    np.testing.assert_allclose(p.mean_[0], X[covered].mean(0), rtol=1e-5)
    want = X[covered].std(0)
    want[3] = 1.0
    np.testing.assert_allclose(p.scale_[0], want, rtol=1e-4)
    assert "standardize" in p.get_params() and not hasattr(EdgeProbe().fit(X[:, :4], y, spans), "mean_")


def _mixed_width_spans(n_words=3000, n=700, seed=3):
    """Spans mostly one word wide with a few long ones, in random order (like constituents)."""
    rng = np.random.default_rng(seed)
    widths = np.where(rng.random(n) < 0.05, rng.integers(20, 60, n), rng.integers(1, 4, n))
    starts = rng.integers(0, n_words - 60, n)
    return np.stack([starts, starts + widths], 1)


@pytest.mark.parametrize("pooling", [p for p in sorted(POOLERS) if POOLERS[p].linear])
def test_pooling_in_width_sorted_chunks_equals_pooling_each_span_alone(pooling):
    """Pre-pooled span vectors come back in the targets' order and equal each span pooled by itself."""
    from probes.edge import _SpanFeatures
    layers = [_store(seed=s) for s in range(3)]
    spans = _mixed_width_spans()
    fn = make_pooler(pooling, layers[0].shape[1]).pieces
    feats = _SpanFeatures(layers, [spans], True, [fn], torch.device("cpu"), cache=False)
    idx = np.random.default_rng(0).permutation(len(spans))[:600]
    got = feats._pooled(idx)[0][0]
    for j in range(0, len(idx), 37):
        x, mask = feats._tokens(spans, idx[j:j + 1])
        torch.testing.assert_close(got[j:j + 1], fn(x, mask), rtol=0, atol=0)


def test_pooling_pads_each_chunk_only_to_its_own_widest_span(monkeypatch):
    """A few long spans do not make every target pay for their width: no span is padded to more than
    twice its width, so the token rows gathered stay within twice the spans' own (in file order, one
    chunk would pad all 700 targets to the widest, ~60)."""
    from probes import edge
    layers = [_store()]
    spans = _mixed_width_spans()
    gathered = []
    real = edge._SpanFeatures._tokens
    monkeypatch.setattr(edge._SpanFeatures, "_tokens",
                        lambda self, s, idx: gathered.append(int((s[idx, 1] - s[idx, 0]).max()) * len(idx))
                        or real(self, s, idx))
    fn = make_pooler("mean", layers[0].shape[1]).pieces
    edge._SpanFeatures(layers, [spans], True, [fn], torch.device("cpu"), cache=True)
    assert sum(gathered) <= 2 * int((spans[:, 1] - spans[:, 0]).sum())
