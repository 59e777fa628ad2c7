"""Layer analyses: a label planted only in layer 2 (the scalar mix: layer 4, so a uniform mix fails) of a
5-layer fake store is found there."""
import numpy as np
import pytest

from probes.layers import (MIX_COLUMNS, PROBING_COLUMNS, SUMMARY_COLUMNS, ProbeData, _metric_rows, center_of_gravity,
                           cross_fit_best, cumulative_scores, differential_scores, expected_layer, per_layer_scores,
                           scalar_mix_probe)

PARAMS = dict(pooling="mean", proj_dim=16, hidden=32, lr=1e-2, batch_size=128, max_epochs=20, patience=4)



def _plant(layer: int) -> tuple[ProbeData, ProbeData]:
    """5 layers of noise; `layer` also carries the label linearly (Tenney-style fake store)."""
    rng = np.random.default_rng(0)
    n_words, d, n_t = 2000, 8, 1600
    X = rng.standard_normal((5, n_words, d)).astype(np.float32)
    rows = rng.permutation(n_words)[:n_t]
    y = rng.integers(0, 3, n_t)
    X[layer, rows, :3] += 3.0 * np.eye(3)[y]
    X = X.astype(np.float16)
    span = np.stack([rows, rows + 1], 1)
    train = ProbeData([X[l] for l in range(5)], y[:1200], span[:1200])
    test = ProbeData(X, y[1200:], span[1200:])
    return train, test


@pytest.fixture(scope="module")
def planted():
    return _plant(2)


@pytest.fixture(scope="module")
def planted_last():
    """The label in the last layer (4): a mix that stayed near uniform would put E_s[l] at the middle (2)."""
    return _plant(4)


def test_formulas_by_hand():
    assert expected_layer([0.1, 0.2, 0.7]) == pytest.approx(1.6)
    assert expected_layer([0.5, 0.5], layer_ids=[3, 5]) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        expected_layer([0.5, 0.6])
    np.testing.assert_allclose(differential_scores([0.5, 0.5, 0.9, 0.95]), [0, 0, 0.4, 0.05])
    # (1*0 + 2*0.4 + 3*0.1) / 0.5 = 2.2
    assert center_of_gravity([0.0, 0.0, 0.4, 0.1]) == pytest.approx(2.2)
    assert np.isnan(center_of_gravity([0.0, -0.1, 0.05]))


def test_per_layer_scores_peak_at_planted_layer(planted):
    train, test = planted
    df = per_layer_scores(train, test, probe_params=PARAMS, model="m", task="t", n_boot=100)
    assert list(df.columns) == PROBING_COLUMNS
    acc = df[(df.metric == "accuracy") & (df["mode"] == "single")].set_index("layer")["value"]
    assert acc.idxmax() == 2 and acc[2] > 0.9
    assert all(acc[l] < 0.5 for l in (0, 1, 3, 4))
    row = df[(df.metric == "accuracy") & (df.layer == 2) & (df["mode"] == "single")].iloc[0]
    assert row.ci_low <= row.value <= row.ci_high and row.ci_high - row.ci_low < 0.1
    assert set(df["mode"]) == {"single", "best"} and set(df["pooling"]) == {"mean"}
    # both halves of the test items choose the planted layer; its held-out score is the layer's own
    best = df[(df["mode"] == "best") & (df.metric == "accuracy")].iloc[0]
    assert best.layer == 2 and best.value == pytest.approx(acc[2])


def _items(correct):
    """(N, 4) per-item counts from a 0/1 vector (tp = correct, fp = fn = wrong)."""
    c = np.asarray(correct, dtype=float)
    return np.stack([c, c, 1 - c, 1 - c], axis=1)


def test_cross_fit_best_chooses_on_the_other_half():
    # 8 items. Layer 0 is right on the first half only, layer 1 on the second half only, layer 2 on
    # 3 of 4 of each half. In sample, layer 2 is best (0.75 vs 0.5). Chosen on the first half, layer 0
    # wins (4/4) and scores 0/4 on the second; chosen on the second, layer 1 wins and scores 0/4 on the
    # first: the held-out best is 0.0, the halves disagree (layer -1).
    items = {(0, 0): _items([1, 1, 1, 1, 0, 0, 0, 0]), (1, 0): _items([0, 0, 0, 0, 1, 1, 1, 1]),
             (2, 0): _items([1, 1, 1, 0, 1, 1, 1, 0])}
    layer, chosen = cross_fit_best(items, [0, 1, 2], [0])
    assert layer == -1 and chosen[0][:, 0].tolist() == [0] * 8
    # when one layer is best on both halves, its items come back unchanged; ties go to the lower layer
    items[(0, 0)] = _items([1, 1, 1, 0, 0, 0, 0, 0])
    items[(1, 0)] = _items([1, 1, 1, 1, 1, 1, 1, 0])
    items[(2, 0)] = _items([1, 1, 1, 1, 1, 1, 1, 0])
    layer, chosen = cross_fit_best(items, [0, 1, 2], [0])
    assert layer == 1 and np.array_equal(chosen[0], items[(1, 0)])
    # the choice uses the seed-mean accuracy: two seeds that disagree are averaged
    two = {(0, 0): _items([1, 1, 1, 1]), (0, 1): _items([0, 0, 0, 0]),
           (1, 0): _items([1, 0, 1, 0]), (1, 1): _items([1, 0, 1, 0])}
    assert cross_fit_best(two, [0, 1], [0, 1])[0] == 0     # 0.5 vs 0.5 on each half: the lower layer
    with pytest.raises(ValueError, match="at least 2"):
        cross_fit_best({(0, 0): _items([1])}, [0], [0])
    # 2 items are enough: one per half; layer 0 is right on the first, layer 1 on the second, so each
    # half's choice is wrong on the other item
    layer, chosen = cross_fit_best({(0, 0): _items([1, 0]), (1, 0): _items([0, 1])}, [0, 1], [0])
    assert layer == -1 and chosen[0][:, 0].tolist() == [0, 0]


def test_metric_rows_by_hand_with_an_interval_from_any_positive_n_boot():
    # 3 of 4 items right: accuracy 0.75; tp = 3, fp = fn = 1: micro-F1 = 6 / (6 + 2) = 0.75
    items = _items([1, 1, 1, 0])
    base = {"model": "m", "layer": 3}
    none = _metric_rows(items, base, seed=5, n_boot=0)
    assert [(r["metric"], r["value"], r["seed"], r["layer"]) for r in none] == [("accuracy", 0.75, 5, 3),
                                                                             ("micro_f1", 0.75, 5, 3)]
    assert all(np.isnan(r["ci_low"]) and np.isnan(r["ci_high"]) for r in none)
    # one resample already gives an interval (a degenerate one: that resample's value at both ends)
    one = _metric_rows(items, base, seed=5, n_boot=1)
    assert [r["value"] for r in one] == [0.75, 0.75]
    assert all(r["ci_low"] == r["ci_high"] and 0 <= r["ci_low"] <= 1 for r in one)


def test_per_layer_seed_aggregate_rows(planted):
    train, test = planted
    df = per_layer_scores(train, test, layers=[2], probe_params=PARAMS, seeds=(0, 1), n_boot=0)
    agg = df[(df.seed == -1) & (df.metric == "accuracy")]
    per_seed = df[(df.seed >= 0) & (df.metric == "accuracy")]["value"]
    assert len(agg) == 1 and agg.value.iloc[0] == pytest.approx(per_seed.mean())


def test_scalar_mix_weights_peak_at_planted_layer(planted_last):
    train, test = planted_last
    res = scalar_mix_probe(train, test, probe_params={**PARAMS, "max_epochs": 25, "patience": 25},
                           model="m", task="t", n_boot=0)
    assert list(res.mix_weights.columns) == MIX_COLUMNS and list(res.summary.columns) == SUMMARY_COLUMNS
    w = res.mix_weights.set_index("layer")["weight"]
    assert w.idxmax() == 4 and w[4] > 0.5 and w.sum() == pytest.approx(1)
    e_s = res.summary.set_index("metric").loc["expected_layer", "value"]
    assert e_s == pytest.approx(expected_layer(w.to_numpy()))
    # w_4 > 0.5, the rest spread evenly: E_s > 0.5 * 4 + 0.5 * (0 + 1 + 2 + 3) / 4 = 2.75
    assert e_s > 2.75
    assert expected_layer(np.full(5, 0.2)) == pytest.approx(2.0)  # uniform weights would fail the line above
    assert res.probing[res.probing.metric == "accuracy"].value.iloc[0] > 0.9
    assert set(res.probing.layer) == {-1} and set(res.probing["mode"]) == {"mix"}
    # every table names its model, task and seed
    for table in (res.probing, res.summary, res.mix_weights):
        assert set(table.model) == {"m"} and set(table.task) == {"t"}
    assert set(res.mix_weights.seed) == {0} and set(res.probing.seed) == {0}


def test_scalar_mix_of_two_layers_weights_the_planted_one(planted):
    # two layers are the fewest a mix takes: here the planted layer 2 and the noise of layer 0
    train, test = planted
    res = scalar_mix_probe(train, test, layers=[0, 2], probe_params={**PARAMS, "max_epochs": 8}, n_boot=0)
    w = res.mix_weights.set_index("layer")["weight"]
    assert list(w.index) == [0, 2] and w[2] > 0.5
    with pytest.raises(ValueError, match="at least 2 layers"):
        scalar_mix_probe(train, test, layers=[2], probe_params=PARAMS, n_boot=0)


def test_cumulative_scores_jump_at_planted_layer(planted):
    train, test = planted
    items: dict = {}
    res = cumulative_scores(train, test, probe_params=PARAMS, n_boot=0, model="m", task="t", items_out=items)
    f1 = res.probing[res.probing.metric == "micro_f1"].set_index("layer")["value"]
    # every row, the differential ones included, is a cumulative row of this model and task
    assert set(res.probing["mode"]) == {"cumulative"} and set(res.probing.model) == {"m"}
    assert set(res.summary.model) == {"m"} and set(res.summary.task) == {"t"}
    # the per-item counts of each fit, keyed by mode, layer and seed; they are the F1 rows' items
    assert sorted(items) == [("cumulative", l, 0) for l in range(5)]
    tp, fp, fn = items["cumulative", 2, 0][:, 1:].sum(0)
    assert f1[2] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert f1[0] < 0.5 and f1[1] < 0.5 and f1[2] > 0.9 and f1[4] > 0.85
    delta = res.probing[res.probing.metric == "delta_micro_f1"].set_index("layer")["value"]
    assert delta.idxmax() == 2
    cog = res.summary.set_index("metric").loc["center_of_gravity", "value"]
    assert abs(cog - 2) < 0.3
