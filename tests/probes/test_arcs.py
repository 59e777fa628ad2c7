"""Arc probe (Hewitt & Liang 2019 edge prediction): planted heads, control heads by hand, selectivity,
input errors, low rank, determinism."""
import numpy as np
import pytest

from probes.arcs import ARC_BEHAVIOURS, ArcData, ArcProbe, arc_control_behaviours, arc_control_heads, arc_layer_scores

FAST = dict(lr=0.02, batch_size=32, max_epochs=30, patience=3)
MAX_LEN = 10


def _corpus(n_sent=500, n_types=24, seed=0):
    """Sentences of 6..MAX_LEN words with random heads (one root attached to itself) and random types.

    Returns dict of per-word arrays over global rows: pos, head (row), first/last flags, type id, and the
    per-target dep / bounds (every word is a target)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(6, MAX_LEN + 1, n_sent)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    pos, head, bounds = [], [], []
    for s, n in enumerate(lens):
        start = offsets[s]
        root = rng.integers(n)
        for i in range(n):
            j = root if i == root else rng.choice([k for k in range(n) if k != i])
            pos.append(i)
            head.append(start + j)
            bounds.append((start, start + n))
    pos, bounds = np.array(pos), np.array(bounds, dtype=np.int64)
    return dict(pos=pos, head=np.array(head, dtype=np.int64), dep=np.arange(len(pos)), bounds=bounds,
                first=(pos == 0).astype(float), last=(bounds[:, 1] - 1 == np.arange(len(pos))).astype(float),
                type=rng.integers(0, n_types, len(pos)), offsets=offsets, n_types=n_types)


def _onehot(idx, n):
    return np.eye(n)[idx]


def _head_vectors(c, noise=0.1, seed=0):
    """Each word carries its own position and its head's position: x_i^T A x_j = [head(i) == pos(j)]."""
    rng = np.random.default_rng(seed)
    head_pos = c["head"] - c["bounds"][:, 0]
    X = np.concatenate([_onehot(c["pos"], MAX_LEN), _onehot(head_pos, MAX_LEN)], 1)
    return (X + noise * rng.standard_normal(X.shape)).astype(np.float32)


def _identity_vectors(c, noise=0.1, seed=1):
    """Each word carries its type, its position and first/last flags (enough for the control behaviours)."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([_onehot(c["type"], c["n_types"]), _onehot(c["pos"], MAX_LEN),
                        c["first"][:, None], c["last"][:, None]], 1)
    return (X + noise * rng.standard_normal(X.shape)).astype(np.float32)


def _split(c, n_train_sent=400):
    """Target index arrays of the first n_train_sent sentences and of the rest."""
    cut = c["offsets"][n_train_sent]
    return np.arange(cut), np.arange(cut, len(c["dep"]))


@pytest.fixture(scope="module")
def corpus():
    return _corpus()


def test_planted_heads_recovered_and_random_vectors_at_chance(corpus):
    c = corpus
    tr, te = _split(c)
    X = _head_vectors(c)
    p = ArcProbe(**FAST).fit(X, c["dep"][tr], c["head"][tr], c["bounds"][tr])
    assert p.score(X, c["dep"][te], c["head"][te], c["bounds"][te]) > 0.95
    assert p.mean_.shape == p.scale_.shape == (X.shape[1],) and 0 <= p.best_epoch_ < p.n_epochs_
    noise = np.random.default_rng(5).standard_normal(X.shape).astype(np.float32)
    q = ArcProbe(**FAST).fit(noise, c["dep"][tr], c["head"][tr], c["bounds"][tr])
    assert q.score(noise, c["dep"][te], c["head"][te], c["bounds"][te]) < 0.5


def test_low_rank_recovers_planted_heads(corpus):
    c = corpus
    tr, te = _split(c)
    X = [_head_vectors(c)]  # a 1-element list of layers is accepted too
    p = ArcProbe(rank=MAX_LEN, **FAST).fit(X, c["dep"][tr], c["head"][tr], c["bounds"][tr])
    assert p.module_.U.shape == (2 * MAX_LEN, MAX_LEN)
    assert p.score(X, c["dep"][te], c["head"][te], c["bounds"][te]) > 0.95


def test_control_heads_by_hand_and_stable():
    types = ["the", "cat", "sat", "."]
    dep = np.array([10, 11, 12, 13])
    bounds = np.array([[10, 14]] * 4)
    beh = arc_control_behaviours(types, seed=0)
    expected = [[dep[i], 10, 13][b] for i, b in enumerate(beh)]
    np.testing.assert_array_equal(arc_control_heads(types, dep, bounds), expected)
    # fixed per type: the same type elsewhere, in another sentence, among other types, in another call
    more = ["zebra", "sat", "the", "xylophone", "sat"]
    h = arc_control_heads(more, np.array([0, 1, 2, 3, 4]), np.array([[0, 5]] * 5))
    for i, t in ((1, "sat"), (2, "the"), (4, "sat")):
        assert h[i] == [i, 0, 4][beh[types.index(t)]]
    np.testing.assert_array_equal(arc_control_behaviours(more), arc_control_behaviours(more, seed=0))
    # one type of each behaviour, checked by hand on a 3-word sentence [5, 8): self, first, last
    many = [f"t{i}" for i in range(50)]
    b = arc_control_behaviours(many)
    picks = [many[int(np.flatnonzero(b == k)[0])] for k in range(3)]
    np.testing.assert_array_equal(arc_control_heads(picks, np.array([6, 6, 6]), np.array([[5, 8]] * 3)), [6, 5, 7])
    assert ARC_BEHAVIOURS == ("self", "first", "last")
    assert not np.array_equal(arc_control_behaviours(many, seed=1), b)


def test_control_behaviours_roughly_uniform():
    b = arc_control_behaviours([f"type{i}" for i in range(3000)])
    share = np.bincount(b, minlength=3) / len(b)
    assert np.all((share > 0.25) & (share < 0.42)), share


def test_control_task_learnable_from_word_identity(corpus):
    c = corpus
    tr, te = _split(c)
    X = _identity_vectors(c)
    types = np.array([f"w{t}" for t in c["type"]])
    ctrl = arc_control_heads(types, c["dep"], c["bounds"])
    assert len(set(arc_control_behaviours(types))) == 3
    p = ArcProbe(**FAST).fit(X, c["dep"][tr], ctrl[tr], c["bounds"][tr])
    assert p.score(X, c["dep"][te], ctrl[te], c["bounds"][te]) > 0.9


def test_arc_layer_scores_selectivity_at_best_layer(corpus):
    """Layer 0: identity only (control high, task at chance); layer 1: the true heads (task high)."""
    c = corpus
    tr, te = _split(c)
    ident, heads = _identity_vectors(c), _head_vectors(c)
    heads = np.concatenate([heads, np.zeros((len(heads), ident.shape[1] - heads.shape[1]), np.float32)], 1)
    X = [ident, heads]
    types = np.array([f"w{t}" for t in c["type"]])
    train = ArcData(X, c["dep"][tr], c["head"][tr], c["bounds"][tr])
    test = ArcData(X, c["dep"][te], c["head"][te], c["bounds"][te])
    res = arc_layer_scores(train, test, probe_params=FAST, train_types=types[tr], test_types=types[te],
                           model="m", n_boot=20)
    p = res.probing
    acc = p[p.metric == "accuracy"].set_index(["layer", "mode"])["value"]
    sel = p[p.metric == "selectivity"].set_index("layer")["value"]
    for l in (0, 1):
        assert sel[l] == pytest.approx(acc[l, "single"] - acc[l, "control"])
    assert acc[1, "single"] > 0.95 and acc[0, "control"] > 0.9
    assert sel[1] > sel[0]
    assert res.summary.to_dict("records") == [{"model": "m", "task": "arcs", "metric": "selectivity",
                                               "value": pytest.approx(sel[1])}]
    assert set(p.probe) == {"bilinear"} and set(p.pooling) == {"first"}
    best = p[(p["mode"] == "best") & (p.metric == "accuracy") & (p.seed >= 0)]   # chosen on held-out items
    assert set(best.layer) == {1} and (best.value > 0.95).all()
    assert (p[p.metric == "micro_f1"].value.to_numpy() == p[p.metric == "accuracy"].value.to_numpy()).all()
    assert (p[p.metric == "accuracy"].ci_low <= p[p.metric == "accuracy"].value).all()


def test_score_mask_restricts_evaluation(corpus):
    c = corpus
    tr, te = _split(c)
    X = np.random.default_rng(3).standard_normal((len(c["dep"]), 8)).astype(np.float32)
    mask = c["pos"][te] % 2 == 0  # stand-in for "not punctuation"
    train = ArcData([X], c["dep"][tr], c["head"][tr], c["bounds"][tr])
    test = ArcData([X], c["dep"][te], c["head"][te], c["bounds"][te], score_mask=mask)
    res = arc_layer_scores(train, test, probe_params=FAST, control=False, n_boot=0)
    p = ArcProbe(**FAST).fit(X, c["dep"][tr], c["head"][tr], c["bounds"][tr])
    expected = p.score(X, c["dep"][te][mask], c["head"][te][mask], c["bounds"][te][mask])
    got = res.probing.query("metric == 'accuracy'").value.item()
    assert got == pytest.approx(expected) and res.summary.empty
    with pytest.raises(ValueError, match="score_mask"):
        arc_layer_scores(train, test, probe_params=FAST, control=False, score_mask=np.zeros(len(te), bool))
    with pytest.raises(ValueError, match="train_types"):
        arc_layer_scores(train, test, probe_params=FAST)


def test_input_errors_name_the_argument():
    X = np.zeros((20, 4), np.float32)
    dep, head, bounds = np.array([0, 1, 2]), np.array([1, 1, 1]), np.array([[0, 3]] * 3)
    p = ArcProbe()
    with pytest.raises(ValueError, match="dep: .*outside"):
        p.fit(X, np.array([0, 1, 5]), head, bounds)
    with pytest.raises(ValueError, match="head: .*outside"):
        p.fit(X, dep, np.array([1, 1, 3]), bounds)
    with pytest.raises(ValueError, match="head"):
        p.fit(X, dep, head[:2], bounds)
    with pytest.raises(ValueError, match="bounds"):
        p.fit(X, dep, head, bounds[:2])
    with pytest.raises(ValueError, match="bounds"):
        p.fit(X, dep, head, np.array([[0, 30]] * 3))
    with pytest.raises(ValueError, match="dep: .*empty"):
        p.fit(X, np.array([], dtype=np.int64), np.array([], dtype=np.int64), np.zeros((0, 2), np.int64))
    with pytest.raises(ValueError, match="X: .*one layer"):
        p.fit([X, X], dep, head, bounds)
    with pytest.raises(ValueError, match="types"):
        arc_control_heads(["a", "b"], dep, bounds)
    with pytest.raises(RuntimeError, match="not fitted"):
        p.predict(X, dep, bounds)
    p.fit(X, dep, head, bounds)
    with pytest.raises(ValueError, match="X: width"):
        p.predict(np.zeros((20, 5), np.float32), dep, bounds)
    with pytest.raises(ValueError, match="unknown parameter"):
        p.set_params(hidden=3)


def test_deterministic_given_seed(corpus):
    c = corpus
    tr, te = _split(c)
    X = np.random.default_rng(4).standard_normal((len(c["dep"]), 8)).astype(np.float32)
    args = (c["dep"][tr], c["head"][tr], c["bounds"][tr])
    params = {**FAST, "max_epochs": 3, "rank": 4}
    a = ArcProbe(**params).fit(X, *args)
    b = ArcProbe(**params).fit(X, *args)
    first_pred = a.predict(X, c["dep"][te], c["bounds"][te])
    np.testing.assert_array_equal(first_pred, b.predict(X, c["dep"][te], c["bounds"][te]))
    assert a.history_ == b.history_
    defaults = {"val_fraction": 0.1, "weight_decay": 0.0, "seed": 0, "device": "cpu"}
    assert ArcProbe().set_params(**a.get_params()).get_params() == params | defaults
    a.fit(X, *args)  # refit resets and reproduces
    np.testing.assert_array_equal(a.predict(X, c["dep"][te], c["bounds"][te]), first_pred)
