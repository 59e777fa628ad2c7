"""MDL online code (Voita & Titov 2020): learnable task compresses, random labels do not."""
import numpy as np
import pytest

from probes.mdl import PORTIONS, block_boundaries, online_codelength, uniform_codelength

PARAMS = dict(pooling="mean", proj_dim=16, hidden=32, lr=1e-2, batch_size=64, max_epochs=10, patience=2)



def _data(random_labels: bool):
    rng = np.random.default_rng(0)
    n = 1500
    X = rng.standard_normal((n, 8)).astype(np.float16)
    y = X[:, :4].astype(float).argmax(1)  # 4 classes, linearly readable
    if random_labels:
        y = rng.integers(0, 4, n)
    return X, y, np.stack([np.arange(n), np.arange(n) + 1], 1)


def test_uniform_codelength_and_boundaries_by_hand():
    assert uniform_codelength(1000, 4) == pytest.approx(2000.0)
    assert uniform_codelength(10, 3) == pytest.approx(10 * np.log2(3))
    assert block_boundaries(1000) == (1, 2, 4, 8, 16, 32, 62, 125, 250, 500, 1000)
    assert block_boundaries(10) == (1, 2, 5, 10)  # 0.25 * 10 = 2.5 rounds to 2: duplicates dropped
    assert PORTIONS[-1] == 1.0


def test_learnable_task_compresses():
    X, y, span = _data(random_labels=False)
    r = online_codelength(X, y, span, probe_params=PARAMS)
    assert r.uniform_codelength == pytest.approx(1500 * 2.0)
    assert r.boundaries[0] == 2  # round(0.001 * 1500)
    assert r.block_codelengths[0] == pytest.approx(2 * 2.0)  # first block: |block| * log2 K
    assert r.online_codelength == pytest.approx(sum(r.block_codelengths))
    assert r.compression > 2.0 and r.online_codelength < 0.5 * r.uniform_codelength
    rows = r.rows(model="m", task="t", layer=3)
    assert {row["metric"] for row in rows} == {"online_codelength_bits", "uniform_codelength_bits", "compression"}


def test_random_labels_do_not_compress():
    X, y, span = _data(random_labels=True)
    r = online_codelength(X, y, span, probe_params=PARAMS)
    assert 0.85 < r.compression < 1.05
