"""The zoo's probing floors (`workbench.analyses.zoo.probing_floors`): each system's held-out best-layer
score set beside the same score of its untrained architecture (probe_items mode "random_init", its layer
chosen on held-out items too) and of the structural trees, on the same items, with a multi-bootstrap
interval over seeds x items, compared in a family of their own under Holm (planted scores recovered)."""
import numpy as np
import pandas as pd
import pytest

from probes.multibootstrap import holm
from workbench.analyses.probing import ITEM_COLUMNS
from workbench.analyses.zoo import model_name, probing_floors, zoo_statistics
from workbench.core.results import write_table


def _items(model: str, task: str, mode: str, accuracy: list[float], n: int, rng: np.random.Generator,
           layers: list[int] | None = None) -> pd.DataFrame:
    """probe_items rows of one model and mode: per layer, n one-label targets each right with the layer's
    accuracy (right: tp 1; wrong: fp 1 and fn 1, so micro F1 = accuracy)."""
    frames = []
    for layer, acc in zip(layers if layers is not None else range(len(accuracy)), accuracy):
        right = (rng.random(n) < acc).astype(np.float32)
        frames.append(pd.DataFrame({"model": model, "task": task, "probe": "linear", "mode": mode, "layer": layer,
                                    "seed": 0, "item": np.arange(n), "correct": right, "tp": right, "fp": 1 - right,
                                    "fn": 1 - right}))
    return pd.concat(frames, ignore_index=True)[ITEM_COLUMNS]


def _zoo(rng: np.random.Generator, n: int = 1500, seeds=(0, 1, 2)) -> pd.DataFrame:
    """System "a": pos best at layer 2 (0.9), its untrained architecture best at layer 1 (0.7); system "b"
    (pos) at its floor, 0.6 at every layer, floor 0.6 too; a structural task with a chain floor above "a"
    ("b" has none there)."""
    parts = []
    for s in seeds:
        a, b = model_name("a", s), model_name("b", s)
        parts += [_items(a, "pos", "single", [0.5, 0.6, 0.9], n, rng),
                  _items(a, "pos", "random_init", [0.5, 0.7, 0.55], n, rng),
                  _items(b, "pos", "single", [0.6, 0.6, 0.6], n, rng),
                  _items(b, "pos", "random_init", [0.6, 0.6, 0.6], n, rng),
                  _items(a, "structural_distance", "single", [0.3, 0.4, 0.45], n, rng),
                  _items(a, "structural_distance", "chain", [0.6], n, rng, layers=[-1]),
                  _items(b, "structural_distance", "single", [0.3, 0.3, 0.3], n, rng)]   # no floor of its own
    return pd.concat(parts, ignore_index=True)


def test_each_system_is_compared_with_its_untrained_architecture_on_the_same_items(tmp_path):
    write_table(tmp_path, "probe_items", _zoo(np.random.default_rng(0)))
    systems = {"a": [0, 1, 2], "b": [0, 1, 2]}
    out = zoo_statistics(tmp_path, systems, n_boot=300, seed=0)
    st = out["zoo_stats"].set_index(["statistic", "task", "system"])
    fl = st.loc[("best_layer_score_floor:random_init", "pos", "a")]
    assert fl.layer == 1 and fl.value == pytest.approx(0.7, abs=0.02) and fl.n_seeds == 3 and fl.n_items == 1500
    assert fl.ci_low < fl.value < fl.ci_high and fl.interval == "multi-bootstrap"
    curve = out["zoo_stats"]
    curve = curve[(curve.statistic == "layer_score_floor:random_init") & (curve.system == "a")]
    np.testing.assert_allclose(curve.sort_values("layer")["value"], [0.5, 0.7, 0.55], atol=0.03)
    c = out["zoo_comparisons"].set_index(["statistic", "task", "system_a", "system_b"])
    above = c.loc[("best_layer_score", "pos", "a", "floor:random_init")]
    assert above.delta == pytest.approx(0.2, abs=0.03) and above.ci_low > 0.1 and above.claim == "A > B"
    at = c.loc[("best_layer_score", "pos", "b", "floor:random_init")]
    assert at.ci_low < 0 < at.ci_high and at.claim == "no claim"
    below = c.loc[("best_layer_score", "structural_distance", "a", "floor:chain")]
    assert below.delta == pytest.approx(-0.15, abs=0.03) and below.claim == "B > A"
    assert ("best_layer_score_floor:chain", "structural_distance", "a") in st.index
    # a family of their own: Holm over the floor comparisons, the systems' primary family untouched
    comps = out["zoo_comparisons"]
    floors = comps[comps.system_b.str.startswith("floor:")]
    assert (floors["family"] == "floor").all() and len(floors) == 3
    np.testing.assert_allclose(floors["p_holm"], holm(floors["p_value"]))
    primary = comps[comps.family == "primary"]
    assert primary[["system_a", "system_b"]].values.tolist() == [["a", "b"]] * 2   # pos, structural_distance


def test_the_floor_layer_is_chosen_on_held_out_items():
    """An untrained architecture with the same accuracy (0.5) at all of its 12 layers: the maximum over
    layers of the seed-mean score would read above 0.5 (the optimism of a maximum); the floor chosen on
    held-out items reads 0.5 on average over planted datasets."""
    values = []
    for k in range(8):
        rng = np.random.default_rng(100 + k)
        models = [model_name("a", s) for s in (0, 1, 2)]
        items = pd.concat([_items(m, "pos", mode, [0.5] * 12, 300, rng) for m in models
                           for mode in ("single", "random_init")], ignore_index=True)
        best = np.stack([items[(items.model == m) & (items["mode"] == "single") & (items.layer == 0)][
            ["correct", "tp", "fp", "fn"]].to_numpy(np.float64) for m in models])
        stats, _ = probing_floors(items, models, "pos", "a", best, n_boot=10, seed=0)
        values.append(next(r["value"] for r in stats if r["statistic"] == "best_layer_score_floor:random_init"))
    assert abs(np.mean(values) - 0.5) < 0.01


def test_a_floor_on_other_items_is_refused():
    rng = np.random.default_rng(0)
    items = pd.concat([_items("a-s0", "pos", "single", [0.5, 0.6], 50, rng),
                       _items("a-s0", "pos", "random_init", [0.5, 0.6], 40, rng)], ignore_index=True)
    best = items[(items["mode"] == "single") & (items.layer == 1)][["correct", "tp", "fp", "fn"]].to_numpy()[None]
    with pytest.raises(ValueError, match="random_init floor scored 40 items, the system 50"):
        probing_floors(items, ["a-s0"], "pos", "a", best, n_boot=10)
