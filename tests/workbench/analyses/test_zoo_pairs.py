"""The zoo's minimal-pair statistics (`workbench.analyses.zoo.pairs_statistics`): each system's accuracy by
its own first scorer over seeds x items, its floors on the same items, and the comparisons on the items
every model scored, between systems and against each floor."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench.analyses.minimal_pairs import ITEM_COLUMNS
from workbench.analyses.zoo import model_name, pairs_statistics


def _items(system: str, seed: int, scorer: str, correct: np.ndarray) -> pd.DataFrame:
    n = len(correct)
    return pd.DataFrame({"model": model_name(system, seed), "id": [f"t:{i}" for i in range(n)], "suite": "templates",
                         "phenomenon": "agreement_pp", "condition": "sing_match", "variant": "template",
                         "scorer": scorer, "good": 0.0, "bad": 0.0, "correct": correct})[ITEM_COLUMNS]


def test_each_system_is_read_by_its_first_scorer_and_compared_on_shared_items():
    n, seeds = 40, (0, 1, 2)
    half = (np.arange(n) < 20).astype(float)
    frames = []
    for s in seeds:
        frames.append(_items("bert", s, "pll", np.ones(n)))
        frames.append(_items("bert", s, "masked_word", np.zeros(n)))            # a later scorer: not read
        frames.append(_items("bert", s, "floor:random_init:pll", np.zeros(n)))  # its own scorer's floor
        frames.append(_items("bert", s, "floor:random_init:masked_word", np.ones(n)))  # another scorer's: not read
        frames.append(_items("bert", s, "floor:bigram", half))
        gpt = half.copy()
        gpt[-1] = np.nan                                                        # one item gpt could not score
        frames.append(_items("gpt", s, "clm", gpt))
    stats, comps = pairs_statistics(pd.concat(frames, ignore_index=True), {"bert": seeds, "gpt": seeds}, n_boot=200)
    by = {r["system"]: r for r in stats if r["statistic"] == "pairs_accuracy"}
    assert by["bert"]["value"] == 1.0 and by["bert"]["n_items"] == n - 1        # the items both scored
    assert by["gpt"]["value"] == pytest.approx(20 / 39) and by["gpt"]["n_seeds"] == 3
    assert by["bert"]["task"] == "pairs:templates:agreement_pp:template" and by["bert"]["statistic"] == "pairs_accuracy"
    floors = {r["statistic"]: r for r in stats if r["system"] == "bert" and r["statistic"] != "pairs_accuracy"}
    assert set(floors) == {"pairs_floor:random_init", "pairs_floor:bigram"}    # gpt has no floor rows here
    assert floors["pairs_floor:random_init"]["value"] == 0.0
    assert floors["pairs_floor:bigram"]["value"] == pytest.approx(20 / 39) and floors["pairs_floor:bigram"]["n_items"] == 39
    by_b = {c["system_b"]: c for c in comps}
    assert set(by_b) == {"gpt", "floor:random_init", "floor:bigram"}
    c = by_b["gpt"]
    assert (c["system_a"], c["system_b"]) == ("bert", "gpt") and c["delta"] == pytest.approx(19 / 39)
    assert c["claim"] == "A > B" and c["ci_low"] > 0
    # against its own floor on the same items: 1.0 - 20/39, claimed at three seeds
    f = by_b["floor:bigram"]
    assert f["system_a"] == "bert" and f["delta"] == pytest.approx(19 / 39) and f["claim"] == "A > B"


def test_a_system_level_with_its_floor_gets_no_claim():
    n, seeds = 40, (0, 1, 2)
    rng = np.random.default_rng(0)
    frames = []
    for s in seeds:
        x = rng.integers(0, 2, n).astype(float)
        frames.append(_items("gpt", s, "clm", x))
        frames.append(_items("gpt", s, "floor:bigram", x))                       # the floor on the same items
        frames.append(_items("gpt", s, "floor:chance", np.full(n, 0.5)))
    stats, comps = pairs_statistics(pd.concat(frames, ignore_index=True), {"gpt": seeds}, n_boot=200)
    by_b = {c["system_b"]: c for c in comps}
    assert by_b["floor:bigram"]["delta"] == 0.0 and by_b["floor:bigram"]["claim"] == "no claim"
    chance = next(r for r in stats if r["statistic"] == "pairs_floor:chance")
    assert chance["value"] == 0.5 and chance["ci_low"] == chance["ci_high"] == 0.5


SYSTEMS = {"bert": [0, 1], "bert-rope": [0, 1], "elmo": [0, 1], "t5": [0, 1]}


@pytest.mark.slow
def test_the_tiny_zoo_scores_every_system_beside_its_floors(zoo_run):
    """configs/zoo-tiny.json end to end: every system's phenomena in zoo_stats with the four floors on the
    same items, equal to `pairs_statistics` recomputed from the written items (the zoo's n_boot and seed),
    each system read by its kind's scorer, and no claim at two seeds, against a floor or another system."""
    from workbench.core.results import load_table

    items, stats = load_table(zoo_run, "minimal_pair_items"), load_table(zoo_run, "zoo_stats")
    comps = load_table(zoo_run, "zoo_comparisons")
    got = stats[stats["statistic"].str.startswith("pairs_")].reset_index(drop=True)
    want, want_comps = pairs_statistics(items, SYSTEMS, n_boot=200, seed=0)
    want = pd.DataFrame(want)[got.columns]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    acc = got[got["statistic"] == "pairs_accuracy"]
    assert set(acc["system"]) == set(SYSTEMS) and acc["task"].str.startswith("pairs:ud:").any()
    assert {"pairs:templates:agreement_pp:template", "pairs:ud:subject_verb_agreement:nonce"} <= set(acc["task"])
    floors = {f"pairs_floor:{f}" for f in ("chance", "frequency", "bigram", "random_init")}
    for (task, system), g in got.groupby(["task", "system"]):
        assert set(g["statistic"]) == {"pairs_accuracy"} | floors, (task, system)
        assert g["n_items"].nunique() == 1                       # the floors stand on the system's items
    used = items[items["model"].isin(["bert-s0", "elmo-s0", "t5-s0"]) & ~items["scorer"].str.startswith("floor:")]
    assert dict(used.groupby("model")["scorer"].first()) == {"bert-s0": "pll", "elmo-s0": "bilm", "t5-s0": "t5_target"}
    pairs = comps[comps["statistic"] == "pairs_accuracy"]
    assert len(pairs) == len(want_comps) and set(pairs["system_b"]) >= {"floor:bigram", "floor:random_init"}
    against_floor = pairs["system_b"].str.startswith("floor:")
    assert (pairs.loc[against_floor, "family"] == "floor").all() and (pairs.loc[~against_floor, "family"] ==
                                                                      "secondary").all()
    assert (pairs["claim"] == "no claim").all()
