"""The zoo's minimal-pair statistics (`workbench.analyses.zoo.pairs_statistics`): each system's accuracy by
its own first scorer over seeds x items, and the comparison on the items every model scored."""
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
        frames.append(_items("bert", s, "floor:random_init:pll", np.zeros(n)))  # a floor: not read
        gpt = half.copy()
        gpt[-1] = np.nan                                                        # one item gpt could not score
        frames.append(_items("gpt", s, "clm", gpt))
    stats, comps = pairs_statistics(pd.concat(frames, ignore_index=True), {"bert": seeds, "gpt": seeds}, n_boot=200)
    by = {r["system"]: r for r in stats}
    assert by["bert"]["value"] == 1.0 and by["bert"]["n_items"] == n - 1        # the items both scored
    assert by["gpt"]["value"] == pytest.approx(20 / 39) and by["gpt"]["n_seeds"] == 3
    assert by["bert"]["task"] == "pairs:templates:agreement_pp:template" and by["bert"]["statistic"] == "pairs_accuracy"
    (c,) = comps
    assert (c["system_a"], c["system_b"]) == ("bert", "gpt") and c["delta"] == pytest.approx(19 / 39)
    assert c["claim"] == "A > B" and c["ci_low"] > 0
