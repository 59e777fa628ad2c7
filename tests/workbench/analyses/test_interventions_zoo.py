"""The zoo's interventions statistics: `workbench zoo` runs the agreement mediation on the models with an
agreement view when its config has an `interventions` section, zoo:stats waits for it, and
`interventions_seed_values` gives each checkpoint's attention share and last-layer share of the NIE at
the reading position, which `interventions_statistics` resamples over seeds, sets beside the random-init
floor and compares across systems (a planted attention-heavy system against an MLP-heavy one)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.analyses.interventions import COLUMNS, interventions_seed_values
from workbench.analyses.zoo import model_name, zoo_statistics
from workbench.core.results import write_table
from workbench.pipeline import build_steps
from workbench.presentation import views
from workbench.zoo import expand_zoo, load_zoo

ZOO_TINY = Path(__file__).resolve().parents[3] / "configs" / "zoo-tiny.json"


def _model(model: str, attn: list[float], mlp: list[float], variant: str = "trained") -> list[tuple]:
    """The rows of one model: per layer the swap-number nie_log of attn_out and mlp_out at the reading
    position, and rows the statistics must not read (another position, metric, intervention, a head)."""
    rows = []
    for layer, (a, m) in enumerate(zip(attn, mlp)):
        for kind, v in (("attn_out", a), ("mlp_out", m)):
            site = f"blocks.{layer}.{kind}"
            rows.append((model, variant, "swap_number", f"{site}@reading", kind, layer, -1, "reading", "nie_log", v,
                         v - 0.01, v + 0.01, 20, 0))
            rows.append((model, variant, "swap_number", site, kind, layer, -1, "all", "nie_log", 9.0, 8.9, 9.1, 20, 0))
            rows.append((model, variant, "same_number", f"{site}@reading", kind, layer, -1, "reading", "nie_log", 9.0,
                         8.9, 9.1, 20, 0))
            rows.append((model, variant, "swap_number", f"{site}@reading", kind, layer, -1, "reading", "nde_log", 9.0,
                         8.9, 9.1, 20, 0))
        rows.append((model, variant, "swap_number", f"blocks.{layer}.attn.head_out[0]@reading", "head_out", layer, 0,
                     "reading", "nie_log", 9.0, 8.9, 9.1, 20, 0))
    return rows


def test_the_zoo_patches_the_models_with_an_agreement_view_before_its_statistics():
    cfg = expand_zoo(load_zoo(ZOO_TINY))
    # zoo-tiny: two BERTs (masked LMs) have a view; ELMo and T5 do not
    assert cfg["interventions"]["models"] == ["bert-s0", "bert-s1", "bert-rope-s0", "bert-rope-s1"]
    assert cfg["interventions"]["config"] == load_zoo(ZOO_TINY).interventions
    steps = {s.name: s for s in build_steps(cfg)}
    assert {f"interventions:{m}" for m in cfg["interventions"]["models"]} <= set(steps["zoo:stats"].after)
    assert "interventions" not in expand_zoo(load_zoo(ZOO_TINY, {"interventions": None}))


def test_interventions_seed_values_by_hand():
    t = pd.DataFrame(_model("a-s0", [0.1, -0.3], [0.2, 0.4]) + _model("a-s0", [1.0, 1.0], [0.0, 0.0], "random_init")
                     + _model("b-s0", [0.0, 0.0], [0.0, 0.0]), columns=COLUMNS)
    got = interventions_seed_values(t)
    # |0.1| + |-0.3| of 0.1 + 0.3 + 0.2 + 0.4 = 1.0; the last layer: 0.3 + 0.4
    assert got[("interventions_attn_share", "")] == pytest.approx({"a-s0": 0.4})
    assert got[("interventions_top_layer_share", "")] == pytest.approx({"a-s0": 0.7})  # b: nothing mediated
    floor = interventions_seed_values(t, "random_init")
    assert floor[("interventions_attn_share", "")] == pytest.approx({"a-s0": 1.0})
    assert floor[("interventions_top_layer_share", "")] == pytest.approx({"a-s0": 0.5})
    assert interventions_seed_values(None) == {} and interventions_seed_values(t.iloc[:0]) == {}


def test_the_zoo_compares_where_agreement_is_mediated_over_seeds(tmp_path):
    """Three seeds a system: "attn" carries 80 % of the NIE in attention, "mlp" 20 %, both floors 50 %;
    the shares come back with their seed intervals, the difference of 0.6 is claimed after Holm, and each
    system is compared with its floor."""
    rng = np.random.default_rng(0)
    systems = {"attn": [0, 1, 2], "mlp": [0, 1, 2]}
    rows = []
    for system, share in (("attn", 0.8), ("mlp", 0.2)):
        for s in systems[system]:
            a = share + 0.01 * rng.standard_normal()
            rows += _model(model_name(system, s), [0.0, a], [0.0, 1.0 - a])  # all of it in the last layer
            rows += _model(model_name(system, s), [0.25, 0.25], [0.25, 0.25], "random_init")
    write_table(tmp_path, "interventions", pd.DataFrame(rows, columns=COLUMNS))
    out = zoo_statistics(tmp_path, systems, n_boot=200, seed=0)
    st = out["zoo_stats"].set_index(["statistic", "system"])
    row = st.loc[("interventions_attn_share", "attn")]
    assert row.n_seeds == 3 and row.interval == "seeds-only" and row.ci_low <= row.value <= row.ci_high
    assert row.value == pytest.approx(0.8, abs=0.02) and row.ci_high - row.ci_low < 0.05
    assert st.loc[("interventions_attn_share", "mlp")].value == pytest.approx(0.2, abs=0.02)
    assert st.loc[("interventions_top_layer_share", "mlp")].value == pytest.approx(1.0)
    assert st.loc[("interventions_attn_share_floor:random_init", "attn")].value == pytest.approx(0.5)
    assert st.loc[("interventions_top_layer_share_floor:random_init", "mlp")].value == pytest.approx(0.5)
    c = out["zoo_comparisons"].set_index(["statistic", "system_a", "system_b"])
    ab = c.loc[("interventions_attn_share", "attn", "mlp")]
    assert ab.delta == pytest.approx(0.6, abs=0.03) and ab.ci_low > 0 and ab.claim != "no claim"
    assert ab.family == "secondary" and ab.p_holm <= 0.05
    fl = c.loc[("interventions_attn_share", "mlp", "floor:random_init")]
    assert fl.delta == pytest.approx(-0.3, abs=0.02) and fl.ci_high < 0 and fl.family == "floor"
    assert c.loc[("interventions_top_layer_share", "attn", "mlp")].claim == "no claim"  # both 1.0: no difference
    for name, table in out.items():  # the report's table: each system's share beside its floor
        write_table(tmp_path, name, table)
    v = views.zoo_interventions_table(tmp_path).set_index(["statistic", "system"])
    assert len(v) == 4 and v.loc[("interventions_attn_share", "attn")].value == pytest.approx(row.value)
    assert (v["floor"] == 0.5).all() and (v["n_seeds"] == 3).all()


def test_no_claim_with_two_seeds_a_system(tmp_path):
    systems = {"attn": [0, 1], "mlp": [0, 1]}
    rows = []
    for system, share in (("attn", 0.8), ("mlp", 0.2)):
        for s in systems[system]:
            rows += _model(model_name(system, s), [0.0, share + 0.01 * s], [0.0, 1.0 - share - 0.01 * s])
    write_table(tmp_path, "interventions", pd.DataFrame(rows, columns=COLUMNS))
    c = zoo_statistics(tmp_path, systems, n_boot=200, seed=0)["zoo_comparisons"]
    ab = c[(c.statistic == "interventions_attn_share")].iloc[0]
    assert ab.delta == pytest.approx(0.6, abs=0.02) and ab.claim == "no claim"


@pytest.mark.slow
def test_the_tiny_zoo_writes_where_agreement_is_mediated(zoo_run):
    """configs/zoo-tiny.json end to end: the two BERTs' interventions tables, each system's shares in
    zoo_stats as the seed mean of its checkpoints' values beside its floor, no claim at two seeds, and the
    report's table."""
    from workbench.core.results import load_table
    from workbench.presentation.report import objectives_section

    t = load_table(zoo_run, "interventions")
    assert set(t["model"]) == {"bert-s0", "bert-s1", "bert-rope-s0", "bert-rope-s1"}
    values = interventions_seed_values(t)
    stats = load_table(zoo_run, "zoo_stats").set_index(["statistic", "system"])
    for statistic in ("interventions_attn_share", "interventions_top_layer_share"):
        for system in ("bert", "bert-rope"):
            row = stats.loc[(statistic, system)]
            mine = [values[(statistic, "")][model_name(system, s)] for s in (0, 1)]
            assert row.value == pytest.approx(np.mean(mine)) and row.n_seeds == 2 and 0 <= row.value <= 1
            assert (f"{statistic}_floor:random_init", system) in stats.index
    comps = load_table(zoo_run, "zoo_comparisons")
    mine = comps[comps["statistic"].str.startswith("interventions_")]
    assert set(mine["system_b"]) == {"bert-rope", "floor:random_init"} and (mine["claim"] == "no claim").all()
    table = next(df for caption, df in objectives_section(zoo_run).tables if caption.startswith("Where agreement"))
    assert set(table["system"]) == {"bert", "bert-rope"} and len(table) == 4
