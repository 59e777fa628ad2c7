"""Erasers for amnesic probing (probes/amnesic.py): a property written into a few directions is
removed by LEACE exactly (a probe falls to chance, the cross-covariance is 0) and by INLP, while a
random projection of the same rank leaves it; the controls: random directions moved exactly as far
as LEACE moves the vectors, and LEACE fitted on shuffled labels, which leaves the property; INLP
stops on its dev set, not on its training accuracy."""
import inspect

import numpy as np
import pytest

from probes.amnesic import (INLPEraser, LeaceEraser, MatchedRandomEraser, RandomEraser, ShuffledLabelEraser,
                            displacement)
from probes.logreg import LogisticRegressionLBFGS


def planted(n=3000, d=24, k=3, seed=0, scale=2.0):
    """Vectors with correlated noise, where class c adds scale * v_c for k random directions v_c."""
    fixed = np.random.default_rng(100)  # the same directions and noise shape for every sample
    mix = fixed.standard_normal((d, d)) / np.sqrt(d)
    dirs = fixed.standard_normal((k, d))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    X = rng.standard_normal((n, d)) @ mix + scale * dirs[y]
    return X.astype(np.float32), y


def probe_accuracy(Xtr, ytr, Xte, yte):
    return float((LogisticRegressionLBFGS(C=10.0).fit(Xtr, ytr).predict(Xte) == yte).mean())


def test_leace_removes_a_planted_property_exactly_and_a_random_eraser_does_not():
    X, y = planted()
    Xte, yte = planted(seed=1)
    chance = float(np.max(np.bincount(yte)) / len(yte))
    assert probe_accuracy(X, y, Xte, yte) > 0.95
    leace = LeaceEraser().fit(X, y)
    assert leace.rank_ == 2  # K - 1 directions for K = 3 classes
    Xe = leace.transform(X)
    z = np.eye(3)[y]
    cross = (Xe - Xe.mean(0)).T.astype(np.float64) @ (z - z.mean(0)) / len(X)
    assert np.abs(cross).max() < 1e-5  # no linear signal left (float32 output)
    assert probe_accuracy(Xe, y, leace.transform(Xte), yte) < chance + 0.04
    rand = RandomEraser(rank=leace.rank_, seed=0).fit(X)
    assert probe_accuracy(rand.transform(X), y, rand.transform(Xte), yte) > 0.9


def test_leace_moves_vectors_least_in_the_whitened_norm_and_is_affine():
    # Belrose et al.'s optimality: among affine erasers that zero Cov(r(X), Z), LEACE moves X the
    # least in the norm whitened by Cov(X). The Euclidean projection off the column space of C (rank
    # K - 1 = 2: the centred one-hot columns sum to 0) also zeroes it and removes as many directions,
    # so its whitened change can only be larger; it is what LEACE becomes without its whitening.
    # LEACE's own whitened move is known by hand: W(x - r(x)) = P_U W (x - mu), whose mean squared
    # norm is tr(P_U Cov(WX)) = tr(P_U) = rank.
    X, y = planted(k=3)
    leace = LeaceEraser().fit(X, y)
    x = X.astype(np.float64)
    xc = x - x.mean(0)
    z = np.eye(3)[y]
    cross = xc.T @ (z - z.mean(0)) / len(x)
    u, s, _ = np.linalg.svd(cross, full_matrices=False)
    q = u[:, s > 1e-8 * s.max()]
    assert q.shape[1] == leace.rank_ == 2  # the comparator removes as many directions as LEACE
    euclid = x - xc @ q @ q.T
    evals, evecs = np.linalg.eigh(xc.T @ xc / len(x))
    w = (evecs / np.sqrt(evals)) @ evecs.T
    move = lambda r: float((((r - x) @ w) ** 2).sum(1).mean())
    ours = move(leace.transform(X).astype(np.float64))
    assert ours == pytest.approx(leace.rank_, rel=1e-4)  # tr(P_U)
    assert ours < move(euclid) - 0.02  # 2.00 against 2.06 here
    A = leace.linear_map  # transform(x) = A x + (I - A) mean
    assert np.allclose(leace.transform(X[:5]), x[:5] @ A.T + (np.eye(X.shape[1]) - A) @ leace.mean_, atol=1e-4)
    assert np.linalg.matrix_rank(np.eye(X.shape[1]) - A, tol=1e-8) == leace.rank_


def test_inlp_removes_the_planted_directions_iteratively():
    X, y = planted(k=2, scale=3.0)
    Xte, yte = planted(k=2, seed=1, scale=3.0)
    inlp = INLPEraser(n_iter=10).fit(X, y, Xte, yte)
    assert inlp.accuracies_[0] > 0.95 and inlp.accuracies_[-1] < 0.6
    assert 1 <= inlp.rank_ <= 2 * inlp.n_iter_
    basis = inlp.right_
    assert np.allclose(basis @ basis.T, np.eye(inlp.rank_), atol=1e-8)  # orthonormal removed directions
    Xe = inlp.transform(Xte)
    assert np.abs(Xe.astype(np.float64) @ basis.T).max() < 1e-4  # nothing left along them
    assert probe_accuracy(inlp.transform(X), y, Xe, yte) < 0.62


def test_inlp_stops_on_its_dev_set_where_training_accuracy_would_not_stop_it():
    # 300 rows in 200 dimensions with labels independent of X: a classifier separates its own
    # training rows (accuracy ~1.0) and is at chance on dev rows. Stopping on dev removes nothing;
    # stopping on training accuracy (the dev set = the training set) removes a direction per iteration.
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 200)).astype(np.float32), rng.integers(0, 2, 300)
    Xd, yd = rng.standard_normal((3000, 200)).astype(np.float32), rng.integers(0, 2, 3000)
    dev = INLPEraser(n_iter=5).fit(X, y, Xd, yd)
    assert dev.train_accuracies_[0] > 0.95 and dev.accuracies_[0] < 0.52  # train and dev disagree
    assert dev.n_iter_ == 1 and dev.rank_ == 0
    on_train = INLPEraser(n_iter=5).fit(X, y, X, y)
    assert on_train.n_iter_ == 5 and on_train.rank_ == 5  # the old behaviour: five spurious directions
    # without a dev set, a held-out share of the rows is the dev set (never the training rows)
    held = INLPEraser(n_iter=5, dev_fraction=0.5).fit(X, y)
    assert held.rank_ <= 1 and held.train_accuracies_[0] > 0.95


def test_the_matched_control_moves_vectors_exactly_as_far_as_leace():
    # LEACE's oblique projection moves planted vectors ~17x as far (squared) as a projection off as
    # many uniformly random directions; the matched control, of the same rank, moves them as far on
    # the fitting data to 1e-6, and about as far on held-out data
    X, y = planted()
    Xte, _ = planted(seed=1)
    leace = LeaceEraser().fit(X, y)
    target = displacement(leace, X)[1]
    same_rank = RandomEraser(rank=leace.rank_, seed=0).fit(X)
    assert displacement(same_rank, X)[1] < target / 5  # the old control is far smaller
    for seed in range(3):
        m = MatchedRandomEraser(rank=leace.rank_, target=target, seed=seed).fit(X)
        assert m.rank_ == leace.rank_ and np.allclose(m.right_ @ m.left_, np.eye(m.rank_))  # a projection
        assert displacement(m, X)[1] == pytest.approx(target, rel=1e-6)
        assert m.displacement_ == pytest.approx(target, rel=1e-6)
        assert displacement(m, Xte)[1] == pytest.approx(displacement(leace, Xte)[1], rel=0.1)
    # a target below the uniform draw's move tilts the draw towards low-variance directions
    low = MatchedRandomEraser(rank=2, target=displacement(same_rank, X)[1] / 3, seed=0).fit(X)
    assert low.gamma_ < 0 and displacement(low, X)[1] == pytest.approx(displacement(same_rank, X)[1] / 3, rel=1e-6)


def test_the_matched_control_search_is_short_and_stops_at_the_range_ends(monkeypatch):
    """The search for gamma reaches the target (rtol 1e-9) in a handful of moves (each one QR of a (D, r)
    draw; bisection took about 35), and a target past what any gamma reaches gives the end of the range,
    with the move it reached."""
    import probes.amnesic as amnesic
    X, y = planted()
    leace = LeaceEraser().fit(X, y)
    target = displacement(leace, X)[1]
    calls = []
    qr = np.linalg.qr
    monkeypatch.setattr(amnesic.np.linalg, "qr", lambda a, *k, **kw: calls.append(1) or qr(a, *k, **kw))
    m = MatchedRandomEraser(rank=leace.rank_, target=target, seed=0).fit(X)
    assert m.displacement_ == pytest.approx(target, rel=1e-9) and len(calls) <= 15
    top = np.linalg.eigvalsh(np.cov(X.T.astype(np.float64), bias=True))[-leace.rank_:].sum()
    far = MatchedRandomEraser(rank=leace.rank_, target=2 * top, seed=0, max_gamma=8.0).fit(X)
    assert far.gamma_ == 8.0 and far.displacement_ < top * (1 + 1e-9)
    near = MatchedRandomEraser(rank=leace.rank_, target=0.0, seed=0, max_gamma=8.0).fit(X)
    assert near.gamma_ == -8.0 and near.displacement_ > 0


def test_the_shuffled_label_control_leaves_a_planted_property_decodable():
    X, y = planted()
    Xte, yte = planted(seed=1)
    for seed in range(3):
        shuffled = ShuffledLabelEraser(LeaceEraser(), seed=seed).fit(X, y)
        assert shuffled.rank_ == 2  # as many directions as LEACE on the true labels
        assert probe_accuracy(shuffled.transform(X), y, shuffled.transform(Xte), yte) > 0.9
    inlp = ShuffledLabelEraser(INLPEraser(n_iter=3), seed=0).fit(X, y, Xte, yte)
    assert inlp.rank_ == 0  # a classifier of shuffled labels is at chance on dev: INLP removes nothing


def test_bad_input_is_refused():
    X, y = planted(n=50)
    with pytest.raises(ValueError, match="one label per row"):
        LeaceEraser().fit(X, y[:10])
    with pytest.raises(ValueError, match="two classes"):
        LeaceEraser().fit(X, np.zeros(50))
    with pytest.raises(ValueError, match="width"):
        LeaceEraser().fit(X, y).transform(X[:, :5])
    with pytest.raises(ValueError, match="rank"):
        RandomEraser(rank=100).fit(X)
    with pytest.raises(ValueError, match="rank"):
        MatchedRandomEraser(rank=100, target=1.0).fit(X)
    with pytest.raises(ValueError, match="X_dev and y_dev"):
        INLPEraser().fit(X, y, X)


def test_leace_equals_the_reference_implementation():
    # EleutherAI/concept-erasure's LeaceFitter without its two extras (covariance shrinkage and the
    # cap on the erased covariance's trace) computes the same eraser
    ce = pytest.importorskip("concept_erasure")
    torch = pytest.importorskip("torch")
    X, y = planted(n=2000, d=16, k=4)
    ours = LeaceEraser().fit(X, y)
    z = torch.nn.functional.one_hot(torch.as_tensor(y), 4).double()
    ref = ce.LeaceFitter(16, 4, shrinkage=False, constrain_cov_trace=False, svd_tol=1e-8, dtype=torch.float64)
    ref.update(torch.as_tensor(X, dtype=torch.float64), z)
    want = ref.eraser(torch.as_tensor(X, dtype=torch.float64)).numpy()
    assert np.abs(ours.transform(X) - want).max() < 1e-4
    assert ours.rank_ == int(np.linalg.matrix_rank(ref.eraser.proj_left.numpy(), tol=1e-6))


def test_leace_erases_a_property_however_weakly_it_is_encoded():
    # The singular-value cut is relative to the largest one: a property read at a correlation of 1e-6
    # is still a direction to remove (rank 1), only directions small beside the largest are rounding
    # noise. One feature: noise made exactly uncorrelated with y, plus 1e-6 x the centred label.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 1000)
    yc = y - y.mean()
    noise = rng.standard_normal(1000)
    noise -= yc * (noise @ yc) / (yc @ yc)
    X = (noise + 1e-6 * yc)[:, None]
    leace = LeaceEraser().fit(X, y)
    assert leace.rank_ == 1
    moved = X - (X - leace.mean_) @ leace.right_.T @ leace.left_.T   # in float64, before transform's rounding
    assert abs(np.cov(X[:, 0], y)[0, 1]) > 1e-7 and abs(np.cov(moved[:, 0], y)[0, 1]) < 1e-15


def test_inlp_without_a_dev_set_holds_out_its_share_of_the_rows_and_at_least_one(monkeypatch):
    # the classifiers see N - round(dev_fraction x N) rows, and never all N: 80 of 100 at 0.2; of 10
    # rows at 0.04, round(0.4) = 0 would leave no dev row, so one is held out
    import probes.amnesic as amnesic

    seen = []

    class Spy(LogisticRegressionLBFGS):
        def fit(self, X, y):
            seen.append(len(X))
            return super().fit(X, y)

    monkeypatch.setattr(amnesic, "LogisticRegressionLBFGS", Spy)
    X, y = planted(n=100)
    INLPEraser(n_iter=1, dev_fraction=0.2).fit(X, y)
    INLPEraser(n_iter=1, dev_fraction=0.04).fit(X[:10], np.arange(10) % 2)
    assert seen == [80, 9]


@pytest.mark.parametrize("eraser", [LeaceEraser(tol=1e-5), RandomEraser(rank=3, seed=2),
                                    INLPEraser(n_iter=4, min_accuracy=0.4, C=2.0, seed=1, max_iter=50, dev_fraction=0.3),
                                    MatchedRandomEraser(rank=2, target=1.5, seed=3, rtol=1e-8, max_gamma=9.0, tol=1e-7),
                                    ShuffledLabelEraser(LeaceEraser(), seed=4)])
def test_every_eraser_gives_back_its_constructor_parameters(eraser):
    # scikit-learn's contract, which ShuffledLabelEraser's clone of its base relies on: get_params
    # names every constructor parameter, and a copy built from them has the same ones
    params = eraser.get_params()
    assert list(params) == list(inspect.signature(type(eraser)).parameters)
    assert type(eraser)(**params).get_params() == params


def test_erasers_of_rank_zero_leave_the_vectors_where_they_are():
    # LEACE of a property with no linear trace removes nothing; its controls of the same rank must too
    X, _ = planted(n=200)
    for control in (RandomEraser(rank=0), MatchedRandomEraser(rank=0, target=0.0)):
        fitted = control.fit(X)
        assert fitted.rank_ == 0 and np.array_equal(fitted.transform(X), X)
        assert displacement(fitted, X) == (0.0, 0.0)
    assert fitted.displacement_ == 0.0   # the matched control's record of the move it reached


def test_the_matched_control_finds_a_small_tilt_inside_the_first_bracket():
    # a target half way to what gamma = 1 reaches (max_gamma = 1: the range's end) is met by a gamma
    # between 0 and 1, the first bracket the search tries, to rtol
    X, _ = planted()
    top = MatchedRandomEraser(rank=2, target=1e9, seed=0, max_gamma=1.0).fit(X)
    assert top.gamma_ == 1.0
    half = MatchedRandomEraser(rank=2, target=top.displacement_ / 2, seed=0).fit(X)
    assert 0 < half.gamma_ < 1 and half.displacement_ == pytest.approx(top.displacement_ / 2, rel=1e-8)


def _counted(f):
    calls = []

    def move(g):
        calls.append(g)
        return f(g)
    return move, calls


def test_the_matched_control_search_halves_a_kept_ends_value_on_either_side():
    # The Illinois step: an end kept twice in a row has its value halved, so the bracket shrinks from
    # both sides. On a convex move (g^10: the low end moves, the high end is kept) it reaches rtol 1e-9
    # in 13 moves, and on a concave one (a cube root: the other side) in 32; plain regula falsi, or a
    # halving on one side only, takes 22-57
    search = MatchedRandomEraser(target=0.5, rtol=1e-9)._search
    move, calls = _counted(lambda g: g ** 10)
    assert search(move, 0.0, 1.0) == pytest.approx(0.5 ** 0.1, rel=1e-9) and len(calls) <= 16
    search = MatchedRandomEraser(target=1e-3, rtol=1e-9)._search
    move, calls = _counted(lambda g: float(np.cbrt(g - 0.3)))
    assert search(move, 0.0, 1.0) == pytest.approx(0.3 + 1e-9, rel=1e-9) and len(calls) <= 40


def test_the_matched_control_search_at_a_bracket_end_and_over_a_jump():
    search = MatchedRandomEraser(target=1.0)._search
    # a target met exactly at an end of the bracket gives that end
    assert search(lambda g: 1.0 + g, 0.0, 1.0) == 0.0
    assert search(lambda g: g, 0.0, 1.0) == 1.0
    # a target the move jumps over gives the jump's place; at 3e5 the bracket cannot shrink below
    # 1e-12 (floats there are 6e-11 apart), so the search stops after its 200 steps
    move, calls = _counted(lambda g: 0.0 if g < 300000.3 else 2.0)
    assert search(move, 0.0, 1e6) == pytest.approx(300000.3, abs=1e-6) and len(calls) == 202


def test_fit_transform_is_fit_then_transform():
    X, y = planted(n=300)
    for eraser in (LeaceEraser(), RandomEraser(rank=2), ShuffledLabelEraser(seed=1)):
        np.testing.assert_array_equal(eraser.fit_transform(X, y), type(eraser)(**eraser.get_params()).fit(X, y).transform(X))
