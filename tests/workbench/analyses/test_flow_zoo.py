"""The zoo's flow statistics: `workbench zoo` runs the flow suite on every model when its config has a
`flow` section, zoo:stats waits for it, and `flow_seed_values` gives each checkpoint's curves (MI and lens
per layer, with their floors) and scalars (input-token MI at the top layer and its rebuild, the lens' mean
KL, each attribution method's Spearman), which `flow_statistics` resamples over seeds and compares across
systems (a planted loss-then-rebuild curve against a falling one; a planted lens gap in the primary family)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analyses.flow import ATTR_COLUMNS, LENS_COLUMNS, MI_COLUMNS, ZOO_PRIMARY, flow_seed_values
from workbench.analyses.zoo import COMPARED_COLUMNS, STATS_COLUMNS, adjust_claims, flow_statistics, model_name
from workbench.core.results import write_table
from workbench.figures.flow import zoo_flow_figure
from workbench.presentation import report
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


def _lens(model: str, kl: list[float], name: str = "tuned", variant: str = "trained") -> list[tuple]:
    rows = [(model, variant, name, layer, "kl", v, v - 0.01, v + 0.01, 0) for layer, v in enumerate(kl)]
    return rows + [(model, variant, name, layer, "top1_agree", 0.5, 0.4, 0.6, 0) for layer in range(len(kl))]


def test_flow_seed_values_by_hand():
    mi = pd.DataFrame(_curve("mlm-s0", [1.0, 0.7, 0.9]) + _curve("clm-s0", [1.0, 0.9, 0.8])
                      + _curve("clm-s0", [1.0, 0.95, 0.85], "probe"), columns=MI_COLUMNS)
    lens = pd.DataFrame(_lens("clm-s0", [3.0, 1.0, 0.0]) + _lens("clm-s0", [0.0, 0.0, 0.0], "logit", "random_init"),
                        columns=LENS_COLUMNS)
    attr = pd.DataFrame([("clm-s0", "lm", "rollout", "spearman_loo", 0.3, 0.2, 0.4, 10, 0),
                         ("clm-s0", "lm", "random", "spearman_loo", 0.01, 0.0, 0.02, 10, 0),
                         ("clm-s0", "lm", "rollout", "aopc", 9.0, 8.0, 10.0, 10, 0),
                         ("clf-s0", "sst2", "rollout", "spearman_loo", 0.9, 0.8, 1.0, 10, 0)], columns=ATTR_COLUMNS)
    got = flow_seed_values(mi, lens, attr)
    assert got[("flow_input_mi_top_kmeans", -1, True)] == pytest.approx({"mlm-s0": 0.9, "clm-s0": 0.8})
    assert got[("flow_input_mi_rebuild_kmeans", -1, True)] == pytest.approx({"mlm-s0": 0.2, "clm-s0": 0.0})
    assert got[("flow_input_mi_top_probe", -1, True)] == pytest.approx({"clm-s0": 0.85})
    # the curves: each layer's share, the trained model's and its floors' apart; never compared
    assert [got[("flow_mi_input_kmeans", l, False)]["mlm-s0"] for l in range(3)] == pytest.approx([1.0, 0.7, 0.9])
    assert got[("flow_mi_input_kmeans_shuffled", 1, False)] == pytest.approx({"mlm-s0": 0.2, "clm-s0": 0.2})
    assert got[("flow_mi_input_kmeans_random_init", 2, False)]["clm-s0"] == pytest.approx(0.99)
    assert [got[("flow_lens_kl_tuned", l, False)]["clm-s0"] for l in range(3)] == pytest.approx([3.0, 1.0, 0.0])
    # the lens' mean KL below the last layer (3 + 1) / 2, compared; its random-init floor is not
    assert got[(ZOO_PRIMARY, -1, True)] == pytest.approx({"clm-s0": 2.0})
    assert got[("flow_lens_kl_logit_random_init_mean", -1, False)] == pytest.approx({"clm-s0": 0.0})
    # the LM prediction's Spearman only (not a classifier's, not AOPC); the random floor is not compared
    assert got[("flow_attr_spearman_loo_rollout", -1, True)] == pytest.approx({"clm-s0": 0.3})
    assert got[("flow_attr_spearman_loo_random", -1, False)] == pytest.approx({"clm-s0": 0.01})
    assert not [k for k in got if k[0].startswith("flow_attr") and k[0] != "flow_attr_spearman_loo_rollout"
                and k[0] != "flow_attr_spearman_loo_random"]
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
    stats, comps = flow_statistics(tmp_path, systems, n_boot=200, seed=0)
    st = pd.DataFrame(stats).set_index(["statistic", "system"])
    row = st.loc[("flow_input_mi_rebuild_kmeans", "mlm")]
    assert row.n_seeds == 3 and row.ci_low <= row.value <= row.ci_high and row.value == pytest.approx(0.2, abs=0.02)
    assert row.task == "flow" and row.layer == -1
    assert st.loc[("flow_input_mi_rebuild_kmeans", "clm")].value == pytest.approx(0.0)
    c = pd.DataFrame(comps).set_index("statistic").loc["flow_input_mi_rebuild_kmeans"]
    assert (c.system_a, c.system_b) == ("clm", "mlm") and c.delta == pytest.approx(-0.2, abs=0.02)
    assert c.ci_high < 0 and c.claim != "no claim"  # three seeds a system, the interval excludes 0


def test_the_zoo_curves_are_per_layer_seed_means_with_intervals_and_no_comparison(tmp_path):
    # three seeds of an MLM whose layer-1 share is 0.6, 0.7, 0.8 and of a T5 whose decoder stack has its
    # own curve: each layer's row is the seed mean with a seeds-only interval around it
    systems = {"mlm": [0, 1, 2], "t5": [0, 1, 2]}
    rows = []
    for s in systems["mlm"]:
        rows += _curve(model_name("mlm", s), [1.0, 0.6 + 0.1 * s, 0.9])
    for s in systems["t5"]:
        rows += _curve(model_name("t5", s), [1.0, 0.5, 0.4])
        rows += _curve(model_name("t5", s) + ";decoder", [0.9, 0.3, 0.2 + 0.05 * s])
    write_table(tmp_path, "flow_mi", pd.DataFrame(rows, columns=MI_COLUMNS))
    stats, comps = flow_statistics(tmp_path, systems, n_boot=300, seed=0)
    st = pd.DataFrame(stats)
    curve = st[(st["statistic"] == "flow_mi_input_kmeans") & (st["system"] == "mlm")].set_index("layer")
    assert list(curve.index) == [0, 1, 2] and (curve["n_seeds"] == 3).all()
    assert curve.loc[1, "value"] == pytest.approx(0.7)
    assert 0.6 - 1e-9 <= curve.loc[1, "ci_low"] < 0.7 < curve.loc[1, "ci_high"] <= 0.8 + 1e-9  # within the seeds
    assert curve.loc[0, "ci_low"] == curve.loc[0, "ci_high"] == pytest.approx(1.0)  # no seed variance at layer 0
    dec = st[(st["statistic"] == "flow_mi_input_kmeans") & (st["system"] == "t5;decoder")].set_index("layer")
    assert dec.loc[2, "value"] == pytest.approx(0.25) and dec.loc[0, "value"] == pytest.approx(0.9)
    floor = st[(st["statistic"] == "flow_mi_input_kmeans_random_init") & (st["system"] == "mlm")]
    assert len(floor) == 3 and floor["value"].to_numpy() == pytest.approx(0.99)
    # the report's figure: each system's seed-mean curve, its floors dashed beside it
    fig = zoo_flow_figure(st)
    lines = {tr.name: tr for tr in fig.data if tr.xaxis == "x"}
    assert list(lines["mlm"].y) == pytest.approx([1.0, 0.7, 0.9]) and lines["mlm"].line.dash == "solid"
    assert list(lines["t5;decoder"].y) == pytest.approx([0.9, 0.3, 0.25])
    assert lines["mlm: random init (floor)"].line.dash == "dash" and "mlm: shuffled tokens (floor)" in lines
    compared = {c["statistic"] for c in comps}
    assert not {s for s in compared if s.startswith("flow_mi_")}  # curves stand beside, never compared
    assert {(c["system_a"], c["system_b"]) for c in comps if c["statistic"] == "flow_input_mi_top_kmeans"} == {
        ("mlm", "t5"), ("mlm", "t5;decoder"), ("t5", "t5;decoder")}


@pytest.mark.parametrize("n_seeds", [3, 2])
def test_the_lens_primary_statistic_is_holm_adjusted_in_the_primary_family(tmp_path, n_seeds):
    # a CLM whose tuned lens sits 1 nat further from its final distribution than an MLM's, seed after
    # seed; the comparison is the flow suite's declared primary, claimed only with three seeds a system
    systems = {"clm": list(range(n_seeds)), "mlm": list(range(n_seeds))}
    rows, mi = [], []
    for s in range(n_seeds):
        rows += _lens(model_name("clm", s), [3.0 + 0.1 * s, 1.0, 0.0])
        rows += _lens(model_name("mlm", s), [2.0 + 0.1 * s, 0.0, 0.0])
        mi += _curve(model_name("clm", s), [1.0, 0.9, 0.8]) + _curve(model_name("mlm", s), [1.0, 0.9, 0.8])
    write_table(tmp_path, "flow_lens", pd.DataFrame(rows, columns=LENS_COLUMNS))
    write_table(tmp_path, "flow_mi", pd.DataFrame(mi, columns=MI_COLUMNS))
    _, comps = flow_statistics(tmp_path, systems, n_boot=300, seed=0)
    table = adjust_claims(pd.DataFrame(comps, columns=COMPARED_COLUMNS)).set_index("statistic")
    row = table.loc[ZOO_PRIMARY]
    assert row.family == "primary" and row.delta == pytest.approx(1.0)
    assert (table.drop(index=ZOO_PRIMARY)["family"] == "secondary").all()
    assert row.claim == ("A > B" if n_seeds == 3 else "no claim")  # A = clm


@pytest.mark.slow  # 1.8 s on the loaded 2-core box (the report's figures)
def test_the_zoo_report_draws_the_flow_curves_and_tables_the_statistics(tmp_path):
    systems = {"clm": [0, 1, 2], "mlm": [0, 1, 2]}
    mi, lens = [], []
    for s in range(3):
        for system, kl in (("clm", [3.0, 1.0, 0.0]), ("mlm", [2.0, 0.5, 0.0])):
            mi += _curve(model_name(system, s), [1.0, 0.8, 0.7 + 0.01 * s])
            lens += _lens(model_name(system, s), [v + 0.01 * s for v in kl])
    write_table(tmp_path, "flow_mi", pd.DataFrame(mi, columns=MI_COLUMNS))
    write_table(tmp_path, "flow_lens", pd.DataFrame(lens, columns=LENS_COLUMNS))
    stats, _ = flow_statistics(tmp_path, systems, n_boot=100, seed=0)
    probing = [dict(statistic=st, task="pos", system=system, layer=1, value=0.5, ci_low=0.4, ci_high=0.6,
                    item_ci_low=0.45, item_ci_high=0.55, interval="multi-bootstrap", n_seeds=3, n_items=10)
               for st in ("layer_score", "best_layer_score") for system in systems]
    write_table(tmp_path, "zoo_stats", pd.DataFrame(probing + stats, columns=STATS_COLUMNS))
    s = report.objectives_section(tmp_path)
    titles = [f.layout.title.text for f in s.figs]
    assert any(t.startswith("Token identity and the lens per layer, per system") for t in titles), titles
    (table,) = [t for caption, t in s.tables if caption.startswith("The flow suite per system")]
    kl = table[table["statistic"] == ZOO_PRIMARY].set_index("system")["value"]
    assert kl["clm"].startswith("2.010 [") and kl["mlm"].startswith("1.260 [")  # (3 + 1) / 2 and (2 + 0.5) / 2, + 0.01
