"""Structural probes (Hewitt & Manning 2019): trees by hand, metrics by hand (punctuation excluded), a
planted Euclidean embedding of the tree metric recovered by both probes, random vectors, input errors,
determinism."""
import numpy as np
import pytest

from probes.layers import PROBING_COLUMNS
from probes.structural import (
    DepthProbe,
    DistanceProbe,
    StructuralData,
    dspr,
    mst_edges,
    nspr,
    root_accuracy,
    structural_layer_scores,
    tree_depths,
    tree_distances,
    uuas,
)

FAST = dict(rank=32, lr=0.01, batch_size=20, max_epochs=30, patience=3)
MAX_LEN = 15

#        0 -> 1 (root) <- 2 <- 3, 4 -> 2
HEADS = np.array([1, -1, 1, 2, 2])


# ----------------------------------------------------------------------------- trees by hand
def test_tree_depths_and_distances_by_hand():
    assert tree_depths(HEADS).tolist() == [1, 0, 1, 2, 2]
    d = tree_distances(HEADS)
    assert d.dtype.kind == "i"
    assert d.tolist() == [[0, 1, 2, 3, 3],
                          [1, 0, 1, 2, 2],
                          [2, 1, 0, 1, 1],
                          [3, 2, 1, 0, 2],
                          [3, 2, 1, 2, 0]]
    assert tree_distances([-1]).tolist() == [[0]]


@pytest.mark.parametrize("heads, match", [
    ([1, 2, 0], r"exactly one root.*found 0"),
    ([-1, 2, 3, 1], r"word 1 does not reach the root"),
    ([-1, -1], r"exactly one root.*found 2 \(words \[0, 1\]\)"),
    ([-1, 1], r"word 1 has head 1"),
    ([-1, 5], r"word 1 has head 5"),
])
def test_tree_errors(heads, match):
    with pytest.raises(ValueError, match=match):
        tree_depths(heads)
    with pytest.raises(ValueError, match=match):
        tree_distances(heads)


# ----------------------------------------------------------------------------- metrics by hand
def test_uuas_and_root_accuracy_by_hand_without_punctuation():
    # words 0..4 of HEADS plus a punctuation word 5 attached to the root
    heads = [np.array([1, -1, 1, 2, 2, 1])]
    punct = [np.array([False, False, False, False, False, True])]
    d = tree_distances(heads[0]).astype(float)
    assert uuas([d], heads, punct) == 1.0
    # the MST ignores punctuation: make word 5 the hub of every predicted distance, nothing changes
    hub = d.copy()
    hub[5, :] = hub[:, 5] = 0.1
    np.fill_diagonal(hub, 0)
    assert uuas([hub], heads, punct) == 1.0
    assert uuas([hub], heads) < 1.0                     # counted as a word, it breaks the tree
    # a chain 0-1-2-3-4 as prediction: gold edges {01, 12, 23, 24}, predicted {01, 12, 23, 34} -> 3 / 4
    chain = np.abs(np.subtract.outer(np.arange(6), np.arange(6))).astype(float)
    assert uuas([chain], heads, punct) == 0.75
    assert mst_edges(chain[:5, :5]) == {(0, 1), (1, 2), (2, 3), (3, 4)}
    # corpus ratio: a second sentence of 2 words (1 gold edge, found) -> (3 + 1) / (4 + 1)
    assert uuas([chain, np.array([[0, 1.], [1, 0]])], heads + [np.array([-1, 0])],
                punct + [np.array([False, False])]) == pytest.approx(0.8)

    # root accuracy: the punctuation word is least deep but excluded; then word 1 (gold root) wins
    depths = np.array([1.0, 0.5, 1.0, 2.0, 2.0, 0.0])
    assert root_accuracy([depths], heads, punct) == 1.0
    assert root_accuracy([depths], heads) == 0.0
    assert root_accuracy([depths, np.array([0.0, 1.0]), np.array([1.0, 0.0])],
                         heads + [np.array([-1, 0]), np.array([-1, 0])]) == pytest.approx(1 / 3)


def test_spearman_metrics_average_per_length():
    rng = np.random.default_rng(0)
    h5, h6 = np.array([1, -1, 1, 2, 2]), np.array([-1, 0, 1, 2, 3, 4])
    d5, d6 = tree_distances(h5).astype(float), tree_distances(h6).astype(float)
    # exact distances: 1; a monotone transform keeps Spearman at 1
    assert dspr([d5, d6 ** 2], [h5, h6]) == pytest.approx(1.0)
    assert nspr([tree_depths(h5) * 3.0, np.exp(tree_depths(h6))], [h5, h6]) == pytest.approx(1.0)
    # reversed depths of the chain: -1; averaged per length first: (1 + -1) / 2, whatever the counts
    rev = -tree_depths(h6).astype(float)
    assert nspr([tree_depths(h5), rev, rev, rev], [h5, h6, h6, h6]) == pytest.approx(0.0)
    # sentences shorter than 5 words are out of the 5..50 average; a constant prediction scores 0
    h3 = np.array([-1, 0, 0])
    assert nspr([rng.normal(size=3), tree_depths(h5)], [h3, h5]) == pytest.approx(1.0)
    assert np.isnan(dspr([tree_distances(h3)], [h3]))
    assert nspr([np.ones(5)], [h5]) == 0.0


def test_metric_errors():
    with pytest.raises(ValueError, match=r"pred_distances\[0\]: expected shape \(5, 5\)"):
        uuas([np.zeros((4, 4))], [HEADS])
    with pytest.raises(ValueError, match="pred_depths: has 2 sentences but heads has 1"):
        root_accuracy([np.zeros(5), np.zeros(5)], [HEADS])
    with pytest.raises(ValueError, match=r"punct_mask\[0\]: expected a bool array of shape \(5,\)"):
        uuas([np.zeros((5, 5))], [HEADS], [np.zeros(5)])


# ----------------------------------------------------------------------------- planted signal
def _random_heads(rng, n):
    """A random tree: a random order, each word after the first attaches to an earlier one in that order."""
    order = rng.permutation(n)
    heads = np.full(n, -1)
    for k in range(1, n):
        heads[order[k]] = order[rng.integers(k)]
    return heads


def _corpus(n_sent, seed, d=64, noise=0.01, planted=True):
    """Sentences of 8..MAX_LEN words. Planted: the Pythagorean embedding of each tree (word i = sum of
    orthonormal e_c over the arcs c -> head(c) on i's path to the root, e_c indexed by the dependent's
    position c, so ||v_i - v_j||^2 = path length and ||v_i||^2 = depth), mapped by one random
    (MAX_LEN, d) matrix into d dimensions plus isotropic noise. Otherwise Gaussian vectors."""
    rng = np.random.default_rng(seed)
    embed = np.random.default_rng(123).normal(size=(MAX_LEN, d)) / np.sqrt(d)
    lens = rng.integers(8, MAX_LEN + 1, n_sent)
    heads, rows = [], []
    for n in lens:
        h = _random_heads(rng, n)
        v = np.zeros((n, MAX_LEN))
        for i in range(n):
            j = i
            while h[j] >= 0:
                v[i, j] = 1.0
                j = h[j]
        heads.append(h)
        rows.append(v @ embed if planted else rng.normal(size=(n, d)) / np.sqrt(d))
    X = np.concatenate(rows).astype(np.float32)
    X += noise * rng.normal(size=X.shape).astype(np.float32) / np.sqrt(d)
    ends = np.cumsum(lens)
    bounds = np.stack([ends - lens, ends], 1)
    punct = [np.zeros(n, dtype=bool) for n in lens]
    return StructuralData(X, bounds, heads, punct)


@pytest.fixture(scope="module")
def planted():
    return _corpus(300, seed=1), _corpus(60, seed=2)


@pytest.fixture(scope="module")
def distance_probe(planted):
    train, _ = planted
    return DistanceProbe(**FAST).fit(train.X, train.bounds, train.heads)


def test_distance_probe_recovers_planted_tree(planted, distance_probe):
    _, test = planted
    pred = distance_probe.predict_distances(test.X, test.bounds)
    assert [p.shape for p in pred] == [(len(h), len(h)) for h in test.heads]
    assert all(np.allclose(p, p.T, atol=1e-4) and np.all(np.diag(p) == 0) for p in pred)
    scores = distance_probe.score(test.X, test.bounds, test.heads, test.punct_mask)
    assert scores["uuas"] >= 0.99
    assert scores["dspr"] > 0.93      # ceiling here 0.971 (tied integer distances); random vectors 0.28
    assert distance_probe.B_.shape == (32, 64)
    assert 0 <= distance_probe.best_epoch_ < distance_probe.n_epochs_ <= FAST["max_epochs"]


def test_depth_probe_recovers_planted_depths(planted):
    train, test = planted
    p = DepthProbe(**FAST).fit(train.X, train.bounds, train.heads)
    pred = p.predict_depths(test.X, test.bounds)
    assert [d.shape for d in pred] == [(len(h),) for h in test.heads]
    scores = p.score(test.X, test.bounds, test.heads, test.punct_mask)
    assert scores["root_acc"] == 1.0
    # gold depths are tied integers: even the gold plus 1e-3 noise scores NSpr 0.959 (DSpr 0.971) here,
    # so the bound leaves room for another CPU's rounding (random vectors: 0.07)
    assert scores["nspr"] > 0.93


def test_random_vectors_do_not_recover_trees():
    train, test = _corpus(150, seed=3, planted=False), _corpus(40, seed=4, planted=False)
    p = DistanceProbe(**{**FAST, "max_epochs": 10}).fit(train.X, train.bounds, train.heads)
    assert p.score(test.X, test.bounds, test.heads)["uuas"] <= 0.6


def test_determinism_and_params(planted, distance_probe, tmp_path):
    train, test = planted
    mm = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=test.X.shape)
    mm[:] = test.X
    assert all(np.array_equal(a, b) for a, b in zip(distance_probe.predict_distances(mm, test.bounds),
                                                    distance_probe.predict_distances(test.X, test.bounds)))
    again = DistanceProbe(**FAST).fit(train.X, train.bounds, train.heads)
    assert np.array_equal(again.B_.detach().numpy(), distance_probe.B_.detach().numpy())
    assert again.history_ == distance_probe.history_
    other = DistanceProbe(**{**FAST, "seed": 1, "max_epochs": 1}).fit(train.X, train.bounds, train.heads)
    assert not np.array_equal(other.B_.detach().numpy(), distance_probe.B_.detach().numpy())
    assert DistanceProbe().get_params() == dict(rank=128, lr=1e-3, max_epochs=30, patience=3, batch_size=20,
                                                val_fraction=0.1, lr_decay=0.1, seed=0, device="cpu")
    assert DepthProbe().set_params(rank=4).rank == 4
    with pytest.raises(ValueError, match="unknown parameter 'foo'"):
        DepthProbe().set_params(foo=1)


def test_input_errors(planted):
    train, _ = planted
    X, b, h = train.X, train.bounds, train.heads
    with pytest.raises(ValueError, match=r"fit: heads\[0\]: has 3 words but bounds\[0\] spans"):
        DistanceProbe(**FAST).fit(X, b, [np.array([-1, 0, 0])] + list(h[1:]))
    with pytest.raises(ValueError, match=r"fit: heads: has 2 sentences but bounds has 300"):
        DistanceProbe(**FAST).fit(X, b, h[:2])
    bad = list(h)
    bad[4] = np.where(bad[4] == -1, 0, bad[4])
    with pytest.raises(ValueError, match=r"fit: heads\[4\]: expected exactly one root"):
        DepthProbe(**FAST).fit(X, b, bad)
    with pytest.raises(ValueError, match=r"fit: bounds: 1 span\(s\) outside"):
        DistanceProbe(**FAST).fit(X, np.array([[0, len(X) + 1]]), [np.full(len(X) + 1, -1)])
    with pytest.raises(ValueError, match="rank: expected a positive int"):
        DistanceProbe(rank=0).fit(X, b, h)
    with pytest.raises(RuntimeError, match="not fitted"):
        DepthProbe().predict_depths(X, b)


def test_structural_layer_scores_rows(planted):
    train, test = planted
    small = lambda d: StructuralData(np.stack([d.X, d.X[:, ::-1].copy()]), d.bounds[:40], d.heads[:40],
                                     d.punct_mask[:40])
    res = structural_layer_scores(small(train), small(test), layers=[1], seeds=(0, 1), model="m",
                                  task="structural_depth", probe_params={**FAST, "max_epochs": 2})
    df = res.probing
    assert list(df.columns) == PROBING_COLUMNS
    assert set(df["metric"]) == {"root_acc", "nspr"}
    assert sorted(df["seed"].unique().tolist()) == [-1, 0, 1]
    assert (df["task"] == "structural_depth").all() and (df["layer"] == 1).all() and (df["probe"] == "depth").all()
    with pytest.raises(ValueError, match="task: expected one of"):
        structural_layer_scores(train, test, task="structural")
