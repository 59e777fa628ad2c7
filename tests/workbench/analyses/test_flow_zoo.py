"""The zoo's flow statistics: `workbench zoo` runs the flow suite on every model when its config has a
`flow` section, zoo:stats waits for it, and `flow_seed_values` gives each checkpoint's input-token MI at
the top layer and its rebuild, which `seed_statistics` resamples over seeds and compares across systems
(a planted loss-then-rebuild curve against a falling one)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analyses.flow import MI_COLUMNS, flow_seed_values
from workbench.analyses.zoo import model_name, seed_statistics
from workbench.core.results import write_table
from workbench.pipeline import build_steps
from workbench.zoo import expand_zoo, load_zoo

ZOO_TINY = Path(__file__).resolve().parents[3] / "configs" / "zoo-tiny.json"


def _curve(model: str, fractions: list[float], estimator: str = "kmeans") -> list[tuple]:
    rows = []
    for layer, f in enumerate(fractions):
        rows.append((model, "trained", estimator, "input", "none", layer, "mi_fraction", f, f - 0.01, f + 0.01, 0))
        # rows the statistics must not read: the shuffled control, the random-init model, the bits
        rows.append((model, "trained", estimator, "input", "shuffled", layer, "mi_fraction", 0.2, 0.1, 0.3, 0))
        rows.append((model, "random_init", estimator, "input", "none", layer, "mi_fraction", 0.99, 0.98, 1.0, 0))
        rows.append((model, "trained", estimator, "input", "none", layer, "mi_bits", 5 * f, 5 * f, 5 * f, 0))
    return rows


def test_the_zoo_runs_flow_on_every_model_before_its_statistics():
    cfg = expand_zoo(load_zoo(ZOO_TINY, {"flow": {"n_sentences": 20}}))
    assert cfg["flow"] == {"models": list(cfg["models"]), "config": {"n_sentences": 20}}
    steps = {s.name: s for s in build_steps(cfg)}
    assert {f"flow:{m}" for m in cfg["models"]} <= set(steps["zoo:stats"].after)
    assert "flow" not in expand_zoo(load_zoo(ZOO_TINY))  # only where the config asks for it


def test_flow_seed_values_by_hand():
    mi = pd.DataFrame(_curve("mlm-s0", [1.0, 0.7, 0.9]) + _curve("clm-s0", [1.0, 0.9, 0.8])
                      + _curve("clm-s0", [1.0, 0.95, 0.85], "probe"), columns=MI_COLUMNS)
    got = flow_seed_values(mi)
    assert got[("flow_input_mi_top_kmeans", "")] == pytest.approx({"mlm-s0": 0.9, "clm-s0": 0.8})
    assert got[("flow_input_mi_rebuild_kmeans", "")] == pytest.approx({"mlm-s0": 0.2, "clm-s0": 0.0})
    assert got[("flow_input_mi_top_probe", "")] == pytest.approx({"clm-s0": 0.85})
    assert flow_seed_values(None) == {} and flow_seed_values(mi.iloc[:0]) == {}


def test_the_zoo_compares_the_rebuild_across_systems_over_seeds(tmp_path):
    rng = np.random.default_rng(0)
    systems = {"mlm": [0, 1, 2], "clm": [0, 1, 2]}
    rows = []
    for s in systems["mlm"]:  # lost, then rebuilt by 0.2 (+- seed noise)
        rows += _curve(model_name("mlm", s), [1.0, 0.7 + 0.01 * rng.standard_normal(), 0.9])
    for s in systems["clm"]:  # falling only: no rebuild
        rows += _curve(model_name("clm", s), [1.0, 0.9, 0.8 + 0.01 * rng.standard_normal()])
    write_table(tmp_path, "flow_mi", pd.DataFrame(rows, columns=MI_COLUMNS))
    stats, comps = seed_statistics(tmp_path, systems, n_boot=200, seed=0)
    st = pd.DataFrame(stats).set_index(["statistic", "system"])
    row = st.loc[("flow_input_mi_rebuild_kmeans", "mlm")]
    assert row.n_seeds == 3 and row.ci_low <= row.value <= row.ci_high and row.value == pytest.approx(0.2, abs=0.02)
    assert st.loc[("flow_input_mi_rebuild_kmeans", "clm")].value == pytest.approx(0.0)
    c = pd.DataFrame(comps).set_index("statistic").loc["flow_input_mi_rebuild_kmeans"]
    assert (c.system_a, c.system_b) == ("clm", "mlm") and c.delta == pytest.approx(-0.2, abs=0.02)
    assert c.ci_high < 0 and c.claim != "no claim"  # three seeds a system, the interval excludes 0
