"""The faces of the zoo (views, workbench/figures/zoo.py and the report's Objectives section) on what
`workbench zoo configs/zoo-tiny.json` really writes (the session's `zoo_run`): each view against the
raw zoo tables, every "A > B" the report writes against a claim row whose interval excludes 0, and
the missing-table notice on a run without the zoo."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pandas as pd
import pytest

from workbench.core import results
from workbench.figures import zoo as Z
from workbench.presentation import report, views

SYSTEMS = ["bert", "bert-rope", "elmo", "t5"]   # configs/zoo-tiny.json, in its order


def _lines(fig) -> list[str]:
    """Names of the line traces (the bands are filled traces out of the legend; the untrained
    architecture's dashed lines are named "<system> untrained")."""
    return [t.name for t in fig.data if t.fill != "toself"]


@pytest.mark.slow
def test_layer_view_and_figure_are_zoo_stats_rows(zoo_run):
    stats = results.load_table(zoo_run, "zoo_stats")
    assert views.zoo_systems(zoo_run) == SYSTEMS
    tasks = views.zoo_tasks(zoo_run)
    assert tasks == sorted(stats[stats["statistic"] == "layer_score"]["task"].unique()) and tasks
    for task in tasks:
        df = views.zoo_layer_scores(zoo_run, task)
        raw = stats[(stats["statistic"] == "layer_score") & (stats["task"] == task)]
        assert len(df) == len(raw) and not df.duplicated(["system", "layer"]).any()
        both = df.merge(raw, on=["system", "layer"], suffixes=("", "_raw"))
        assert len(both) == len(raw)
        for c in ("value", "ci_low", "ci_high", "item_ci_low", "item_ci_high"):
            np.testing.assert_array_equal(both[c].to_numpy(), both[f"{c}_raw"].to_numpy())
        for system, g in df.groupby("system"):
            np.testing.assert_allclose(g["depth"], g["layer"] / g["layer"].max())
        assert list(dict.fromkeys(df["system"])) == SYSTEMS
        floor = stats[(stats["statistic"] == "layer_score_floor:random_init") & (stats["task"] == task)]
        if len(floor):   # the untrained architecture at the same layer, beside each system's score
            got = df.dropna(subset=["floor"]).merge(floor, on=["system", "layer"], suffixes=("", "_raw"))
            assert len(got) == len(floor)
            np.testing.assert_array_equal(got["floor"], got["value_raw"])
        for x in ("layer", "depth"):
            fig = Z.zoo_layer_figure(df, task, x=x)
            untrained = [t for t in fig.data if t.name.endswith(" untrained")]
            assert [t.name for t in untrained] == [f"{s} untrained" for s in dict.fromkeys(floor["system"])]
            for t in untrained:
                g = df[df["system"] == t.name.removesuffix(" untrained")].dropna(subset=["floor"]).sort_values("layer")
                np.testing.assert_allclose(t.y, g["floor"])
            assert [n for n in _lines(fig) if not n.endswith(" untrained")] == SYSTEMS
            for t in fig.data:
                if t.fill == "toself":     # the band: ci_high forwards, ci_low back
                    g = df[df["system"] == t.name.removesuffix(" interval")].sort_values("layer")
                    np.testing.assert_allclose(t.y, np.r_[g["ci_high"], g["ci_low"][::-1]])
                else:
                    g = df[df["system"] == t.name.removesuffix(" untrained")].sort_values("layer")
                    np.testing.assert_allclose(t.x, g[x])
    with pytest.raises(ValueError, match="x must be one of"):
        Z.zoo_layer_figure(df, task, x="step")


@pytest.mark.slow
def test_summary_comparisons_roles_cka_and_extras(zoo_run, tmp_path):
    stats = results.load_table(zoo_run, "zoo_stats")
    summary = views.zoo_summary_table(zoo_run)
    best = stats[stats["statistic"] == "best_layer_score"].set_index(["task", "system"])["value"]
    assert len(summary) == len(best) and not summary.duplicated(["task", "system"]).any()
    np.testing.assert_array_equal(summary.set_index(["task", "system"])["best"].loc[best.index], best)
    assert "e_s" not in summary and "mdl_compression" not in summary   # zoo-tiny runs neither mix nor mdl

    comps = views.zoo_comparisons_table(zoo_run)
    assert len(comps) == len(results.load_table(zoo_run, "zoo_comparisons"))
    for r in comps.itertuples():
        assert (r.disagree == f"{r.flips} of {r.n_seed_pairs} seed pairs disagree") if r.flips > 0 else r.disagree == ""
        assert r.finding == {"A > B": f"{r.system_a} > {r.system_b}", "B > A": f"{r.system_b} > {r.system_a}",
                             "no claim": "no claim"}[r.claim]
        assert r.seeds == "2: too few to claim"                  # zoo-tiny's two seeds a system
        if r.system_b.startswith("floor:"):                    # a system against its minimal-pair floor
            assert r.compute == "" and not r.budget_differs
            continue
        assert r.compute.startswith(f"{r.flops_a:.2g} vs {r.flops_b:.2g} FLOPs")
        assert r.compute.endswith("budgets differ)") == r.budget_differs
    assert [views.seeds_text(n) for n in (2, 3, 4, 5)] == ["2: too few to claim", "3: few", "4: few", "5"]

    assert (views.zoo_fvf_table(zoo_run) is None) == (not (stats["statistic"] == "finetuning_gain").any())
    roles = views.zoo_role_composition(zoo_run)
    heads = stats[stats["statistic"].str.startswith("heads_")]
    assert len(roles) == len(heads) and set(roles["system"]) == set(heads["system"])
    fig = Z.zoo_roles_figure(roles)
    assert sorted(t.name for t in fig.data) == sorted(roles["role"].unique()) and fig.layout.barmode == "stack"

    # CKA: the seed-averaged matrix by hand, its transpose the other way round, the seed yardstick symmetric
    cka = results.load_table(zoo_run, "zoo_cka")
    pairs = views.zoo_cka_system_pairs(zoo_run)
    assert pairs == [("bert", "bert-rope"), ("bert", "elmo"), ("bert", "t5"), ("bert-rope", "elmo"),
                     ("bert-rope", "t5"), ("elmo", "t5")]
    for a, b in pairs:
        g = cka[(cka["system_a"] == a) & (cka["system_b"] == b)]
        hand = g.groupby(["layer_a", "layer_b"])["value"].mean().unstack().to_numpy()
        m = views.zoo_cka_matrix(zoo_run, a, b)
        np.testing.assert_allclose(m, hand)
        np.testing.assert_allclose(views.zoo_cka_matrix(zoo_run, b, a), hand.T)
        own = views.zoo_cka_matrix(zoo_run, a, a)
        np.testing.assert_allclose(own, own.T)
        fig = Z.zoo_cka_figure(m, a, b, own, views.zoo_cka_matrix(zoo_run, b, b))
        assert len(fig.data) == 3 and fig.data[1].z.shape == hand.shape
    table = views.zoo_cka_table(zoo_run)
    assert len(table) == len(pairs) and table["last"].between(0, 1).all()

    # E_s and MDL columns appear when the run has them (a copy of the run's tables with such rows added)
    run = tmp_path / "extras"
    shutil.copytree(zoo_run / "tables", run / "tables")
    probing = results.load_table(run, "probing")
    mdl = probing[probing["mode"] == "single"].drop_duplicates(["model", "task", "layer"]).assign(
        mode="mdl", metric="compression", value=lambda d: 1.0 + d["layer"])
    results.write_table(run, "probing", pd.concat([probing, mdl], ignore_index=True))
    ps = results.load_table(run, "probing_summary")
    es = ps[["model", "task"]].drop_duplicates().assign(metric="expected_layer", value=1.5)
    results.write_table(run, "probing_summary", pd.concat([ps, es], ignore_index=True))
    extra = views.zoo_summary_table(run)
    structural = extra["task"].isin(list(views.ZOO_METRIC_NAMES))  # no scalar mix for a structural probe
    assert structural.any() and extra.loc[structural, "e_s"].isna().all()
    extra = extra[~structural]
    assert (extra["e_s"] == 1.5).all() and (extra["mdl_layer"] == extra["n_layers"]).all()
    assert (extra["mdl_compression"] == 1.0 + extra["n_layers"]).all()
    s = report.objectives_section(run)
    assert "Fayyaz et al. 2021" in s.tables[0][0] and "e_s" in s.tables[0][1]


@pytest.mark.slow
def test_objectives_section_states_intervals_and_only_claimed_orders(zoo_run):
    keys = report.section_keys()
    assert keys.index("objectives") == keys.index("probing") + 1
    s = report.objectives_section(zoo_run)
    assert s.title == "Objectives" and not s.missing
    text = " ".join(s.findings)
    assert all(system in text for system in SYSTEMS)
    every = results.load_table(zoo_run, "zoo_comparisons")
    comps = every[~every["system_b"].str.startswith("floor:")]   # the floors: in the task clauses
    claimed = comps[comps["claim"] != "no claim"]
    orders = re.findall(r"(\w+) > (\w+) in ([^:]+):", text)
    assert len(orders) == len(claimed)
    for win, lose, _ in orders:   # each "X > Y" is a claim row whose interval of X - Y excludes 0
        fwd = comps[(comps["system_a"] == win) & (comps["system_b"] == lose) & (comps["ci_low"] > 0)]
        back = comps[(comps["system_a"] == lose) & (comps["system_b"] == win) & (comps["ci_high"] < 0)]
        rows = pd.concat([fwd.assign(claim_ok=fwd["claim"] == "A > B"), back.assign(claim_ok=back["claim"] == "B > A")])
        assert len(rows) and rows["claim_ok"].all(), (win, lose)
    for c in s.findings:           # every order comes with its interval, flipped ones with the disagreeing pairs
        if re.search(r"\w+ > \w+ in ", c):
            assert re.search(r"-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]", c), c
    for r in claimed[claimed["flips"] > 0].itertuples():
        assert f"({r.flips} of {r.n_seed_pairs} seed pairs disagree)" in text
    if (comps["claim"] == "no claim").all():
        assert f"no comparison between systems is claimed: of the {len(comps)} differences, {len(comps)} have fewer " \
               "than 3 seeds a system" in text
    shown = next(t for c, t in s.tables if c.startswith("Comparisons"))
    assert {"finding", "unadjusted", "p_holm", "seeds", "contrast", "compute"} <= set(shown.columns)
    assert len(shown) == len(every)
    summary = views.zoo_summary_table(zoo_run)
    assert summary.loc[summary.task == "structural_distance", "vs_random_init"].notna().all()   # zoo-tiny's floor
    for task in views.zoo_tasks(zoo_run):   # each task's clause gives every system's score with its interval
        clause = next(c for c in s.findings if c.startswith(f"on {task}, the best-layer"))
        assert all(re.search(rf"{sy} \d\.\d{{3}} \[", clause) for sy in SYSTEMS), clause
        floor = summary[(summary.task == task)].dropna(subset=["vs_random_init"])
        if len(floor):   # and, where the run has it, each system minus its untrained architecture, interval beside
            part = clause.split("minus the untrained architecture's on the same items ")[1]
            for r in floor.itertuples():
                assert re.search(rf"{r.system} {r.vs_random_init:.3f} \[-?\d\.\d{{3}}, -?\d\.\d{{3}}\]", part), part
            assert f"of {len(floor)} systems above it after Holm" in part
        unit = "UUAS is" if task == "structural_distance" else "micro F1 is"   # each task in its own metric
        assert clause.startswith(f"on {task}, the best-layer {unit}"), clause
    layer_figs = [f for f in s.figs if "by layer" in f.layout.title.text]
    assert len(layer_figs) == len(views.zoo_tasks(zoo_run)) and all([n for n in _lines(f) if not n.endswith(" untrained")] == SYSTEMS
                                                                 for f in layer_figs)
    md = report.render_markdown("zoo", [s])
    assert "## Objectives" in md and "No zoo" not in md


def test_a_run_without_the_zoo_gets_the_notice_not_an_error(tmp_path):
    run = tmp_path / "bare"
    results.write_table(run, "training", pd.DataFrame(
        {"model": ["m"], "step": [0], "tokens": [0], "split": ["train"], "metric": ["loss"], "value": [9.0]}))
    for name in ("zoo_layer_scores", "zoo_summary_table", "zoo_comparisons_table", "zoo_fvf_table",
                 "zoo_role_composition", "zoo_cka_table", "zoo_training_table"):
        assert getattr(views, name)(run) is None, name
    assert views.zoo_tasks(run) == [] and views.zoo_systems(run) == [] and views.zoo_cka_system_pairs(run) == []
    assert views.zoo_cka_matrix(run, "a", "b") is None
    s = report.objectives_section(run)
    assert not s.findings and not s.figs and not s.tables
    assert report.missing_notices(s) == ["No zoo_stats, zoo_training tables yet: run `workbench zoo CONFIG`."]
    assert "## Objectives" in report.render_markdown("bare", report.build_sections(run))


def test_claims_say_few_seeds_the_contrast_and_a_budget_gap(tmp_path):
    """A hand-made zoo_comparisons table: a claim at three seeds is marked few, a claim between systems whose
    FLOPs differ by more than 25% says so, and the comparisons without a claim are counted by their reason
    (fewer than three seeds, an interval over 0, Holm's correction)."""
    from workbench.analyses.zoo import COMPARISON_COLUMNS

    base = dict(statistic="best_layer_score", task="pos", delta=0.05, ci_low=0.02, ci_high=0.08, p_a_gt_b=1.0,
                n_seed_pairs=9, flips=0, interval="multi-bootstrap", p_value=0.001, family="primary", p_holm=0.004,
                architecture_diff="", steps_a=100.0, steps_b=100.0, tokens_a=1e6, tokens_b=1e6, flops_a=3e12,
                flops_b=2e12, compute_ratio=1.5, budget_differs=True)
    rows = [dict(base, system_a="bert", system_b="roberta", claim="A > B", claim_unadjusted="A > B", n_seeds=3,
                 contrast="objective only"),
            dict(base, system_a="bert", system_b="gpt", claim="A > B", claim_unadjusted="A > B", n_seeds=5,
                 contrast="objective + architecture", flops_b=2.9e12, compute_ratio=3 / 2.9, budget_differs=False),
            dict(base, system_a="gpt", system_b="roberta", claim="no claim", claim_unadjusted="A > B", n_seeds=5,
                 contrast="objective + architecture", p_holm=0.2),
            dict(base, system_a="elmo", system_b="gpt", claim="no claim", claim_unadjusted="no claim", n_seeds=2,
                 contrast="objective + architecture")]
    run = tmp_path / "hand"
    results.write_table(run, "zoo_comparisons", pd.DataFrame(rows)[COMPARISON_COLUMNS])
    clauses = report._objectives_claims(views.zoo_comparisons_table(run))
    few, five, rest = clauses
    assert few.startswith("on pos, bert > roberta in best-layer score: bert minus roberta 0.050 [0.020, 0.080]")
    assert "3 seeds, few" in few and "objective only" in few and "3e+12 vs 2e+12 FLOPs (x1.50: budgets differ)" in few
    assert "few" not in five and "budgets differ" not in five and "objective + architecture" in five
    assert rest == ("2 of 4 comparisons make no claim (1 has fewer than 3 seeds a system; 1 does not survive Holm's "
                    "correction)")


def test_a_comparisons_table_from_before_the_three_seed_rule_is_refused(tmp_path):
    run = tmp_path / "old"
    results.write_table(run, "zoo_comparisons", pd.DataFrame([{"statistic": "best_layer_score", "task": "pos",
                                                               "system_a": "a", "system_b": "b", "claim": "A > B"}]))
    with pytest.raises(ValueError, match="written before the three-seed rule.*re-run `workbench zoo CONFIG`"):
        views.zoo_comparisons_table(run)
