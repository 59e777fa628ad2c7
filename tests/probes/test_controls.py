"""Control tasks (Hewitt & Liang 2019): labels fixed per type, following the label distribution."""
import numpy as np
import pytest

from probes.controls import control_labels, control_task_scores, selectivity, span_types
from probes.layers import ProbeData, per_layer_scores

PARAMS = dict(pooling="mean", proj_dim=16, hidden=32, lr=1e-2, batch_size=128, max_epochs=15, patience=3)



def test_control_labels_fixed_per_type_and_independent_of_context():
    y = np.array(["N"] * 60 + ["V"] * 30 + ["D"] * 10)
    types = [f"w{i % 40}" for i in range(100)]
    c = control_labels(types, y, seed=0)
    for t in set(types):
        assert len({c[i] for i in range(100) if types[i] == t}) == 1
    # same type -> same label in another call with other types around it, in another order
    c2 = control_labels(["zzz", "w7", "w3"], y, seed=0)
    assert c2[1] == c[7] and c2[2] == c[3]
    assert set(c) <= {"N", "V", "D"}
    assert not np.array_equal(control_labels(types, y, seed=1), c)


def test_control_labels_follow_empirical_distribution():
    y = np.array(["N"] * 600 + ["V"] * 300 + ["D"] * 100)
    c = control_labels([f"type{i}" for i in range(20000)], y, seed=0)
    frac = {k: np.mean(c == k) for k in ("N", "V", "D")}
    assert frac == pytest.approx({"N": 0.6, "V": 0.3, "D": 0.1}, abs=0.015)


def test_selectivity_by_hand_and_span_types():
    assert selectivity(0.97, 0.71) == pytest.approx(0.26)
    words = ["the", "cat", "sat", "the"]
    assert span_types(words, np.array([[0, 1], [3, 4], [1, 3]])) == [("the",), ("the",), ("cat", "sat")]
    assert span_types(words, np.array([[0, 1]]), np.array([[2, 3]]))[0] == ("the", "\x1d", "sat")


def test_control_task_scores_selectivity_rows():
    """Vectors carry the real label (type-independent noise added) -> task high, control near chance."""
    rng = np.random.default_rng(0)
    n_types, n_words = 300, 3000
    type_of_row = rng.integers(0, n_types, n_words)
    y_row = rng.integers(0, 2, n_words)  # label of the token, not of its type
    X = rng.standard_normal((2, n_words, 8)).astype(np.float32)
    X[1, :, 0] += 3 * (2 * y_row - 1)
    X = X.astype(np.float16)
    span = np.stack([np.arange(n_words), np.arange(n_words) + 1], 1)
    types = [f"w{t}" for t in type_of_row]
    train, test = ProbeData(X, y_row[:2000], span[:2000]), ProbeData(X, y_row[2000:], span[2000:])
    task = per_layer_scores(train, test, probe_params=PARAMS, n_boot=0)
    res = control_task_scores(train, test, types[:2000], types[2000:], task_scores=task, probe_params=PARAMS,
                              n_boot=0, model="m", task="t")
    p = res.probing
    acc_task = task[(task.metric == "accuracy") & (task["mode"] == "single")].set_index("layer")["value"]
    acc_ctrl = p[p.metric == "accuracy"].set_index("layer")["value"]
    sel = p[p.metric == "selectivity"].set_index("layer")["value"]
    for l in (0, 1):
        assert sel[l] == pytest.approx(acc_task[l] - acc_ctrl[l])
    assert acc_task[1] > 0.95 and acc_ctrl[1] < 0.7
    assert res.summary.value.iloc[0] == pytest.approx(sel[1])  # best task layer is 1
    assert set(p["mode"]) == {"control"}


def test_control_accuracy_rises_and_selectivity_falls_as_word_identity_grows():
    """Hewitt & Liang 2019's point, planted: the real label is a function of the word type and is also
    written plainly in every layer (3 dims, clean); layers 0 -> 2 add a growing random embedding of the
    word type (16 dims, x0, x1.5, x3). An MLP probe can memorise type -> control label only from that
    identity part, so control accuracy climbs from chance to near 1 and selectivity falls to ~0,
    while task accuracy stays ~1 in every layer."""
    rng = np.random.default_rng(0)
    n_types, n_words, d_id, identity = 40, 1500, 16, (0.0, 1.5, 3.0)
    type_of_row = rng.integers(0, n_types, n_words)
    y = rng.integers(0, 3, n_types)[type_of_row]  # real task: one label per word type
    emb = rng.standard_normal((n_types, d_id))
    X = rng.standard_normal((len(identity), n_words, 3 + d_id)).astype(np.float32)
    X[:, :, :3] += 5.0 * np.eye(3)[y]
    for l, scale in enumerate(identity):
        X[l, :, 3:] += scale * emb[type_of_row]
    X = X.astype(np.float16)
    span = np.stack([np.arange(n_words), np.arange(n_words) + 1], 1)
    types = [f"w{t}" for t in type_of_row]
    train, test = ProbeData(X, y[:1000], span[:1000]), ProbeData(X, y[1000:], span[1000:])
    task = per_layer_scores(train, test, probe_params=PARAMS, n_boot=0)
    res = control_task_scores(train, test, types[:1000], types[1000:], task_scores=task, probe_params=PARAMS,
                              n_boot=0)
    p = res.probing
    acc_task = task[(task.metric == "accuracy") & (task["mode"] == "single")].set_index("layer")["value"]
    acc_ctrl = p[(p.metric == "accuracy") & (p.seed == 0)].set_index("layer")["value"]
    sel = p[p.metric == "selectivity"].set_index("layer")["value"]
    # the control task is a random label per type: no feature but word identity predicts it
    c_test = control_labels(types[1000:], y[:1000])
    assert len({(t, c) for t, c in zip(types[1000:], c_test)}) == len(set(types[1000:]))
    chance = np.unique(c_test, return_counts=True)[1].max() / len(c_test)  # majority control label
    assert (acc_task > 0.95).all()
    assert acc_ctrl[0] < chance + 0.05              # no identity: the probe cannot beat chance
    assert acc_ctrl[2] > 0.9                          # identity plain: the probe memorises the types
    assert acc_ctrl[1] - acc_ctrl[0] > 0.03 and acc_ctrl[2] - acc_ctrl[1] > 0.03   # rises with identity
    assert sel[0] - sel[1] > 0.03 and sel[1] - sel[2] > 0.03 and sel[2] < 0.1      # falls with it
    for l in (0, 1, 2):
        assert sel[l] == pytest.approx(acc_task[l] - acc_ctrl[l])
