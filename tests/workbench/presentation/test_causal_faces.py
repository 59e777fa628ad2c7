"""The faces of the causal probes (workbench.presentation: views, analysis_figures, report) on the tables
the analyses really write: a tiny encoder on EWT, head roles (`analyse_heads`), head gating
(`gate_model`), amnesic probing (`amnesic_model`) and the structural probes (`probe_model`), built once
per session (`causal_run` in causal_run.py, also used by tests/apps/test_causal_page.py). Each view's numbers are
checked against a hand computation on the raw table; the report's sections against the same numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.io
import pytest

from tests.apps.fixtures import make_results_fixture
from workbench.core import results
from workbench.core.paths import data_root
from workbench import figures as F
from workbench.presentation import analysis_figures as AF
from workbench.presentation import report, views
from workbench.presentation.report import _f

from .causal_run import causal_run

# slow: the run it reads is trained once per session (`causal_run`); in the full suite an earlier module
# pays for it, in the fast tier this module would (32 s)
pytestmark = [pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return causal_run(tmp_path_factory)


@pytest.fixture(scope="module")
def md(run) -> str:
    return report.write_report(run)[1].read_text()


def _raw(run: Path, name: str) -> pd.DataFrame:
    return results.load_table(run, name)


# ---------------------------------------------------------------------------------------- views
def test_amnesic_summary_is_the_raw_table_regrouped(run):
    raw = _raw(run, "amnesic").groupby(["layer", "eraser", "metric"])["value"].mean()  # controls: over the draws
    s = views.amnesic_summary(run)
    assert list(s.columns) == ["model", "task", "layer", "eraser", "rank", "displacement", "probe_acc_intact",
                               "probe_acc", "lm_loss_delta", "last_layer_acc"] + [
        f"{m}_{c}" for c in ("matched", "shuffled", "same_rank")
        for m in ("displacement", "probe_acc", "lm_loss_delta", "last_layer_acc")] + ["gap", "n_draws"]
    assert set(s["eraser"]) == {"leace"} and sorted(s["layer"]) == [0, 2]   # intact (-1) and controls are columns
    r = s[s["layer"] == 2].iloc[0]
    assert r["probe_acc_intact"] == raw[(2, "none", "probe_acc")] and r["n_draws"] == 2
    assert r["probe_acc"] == raw[(2, "leace", "probe_acc")]
    assert r["probe_acc_matched"] == pytest.approx(raw[(2, "leace_matched", "probe_acc")])
    assert r["probe_acc_shuffled"] == pytest.approx(raw[(2, "leace_shuffled", "probe_acc")])
    assert r["lm_loss_delta_same_rank"] == pytest.approx(raw[(2, "leace_same_rank", "lm_loss_delta")])
    assert r["displacement_matched"] == pytest.approx(raw[(2, "leace_matched", "displacement")])
    assert r["gap"] == pytest.approx(raw[(2, "leace", "lm_loss_delta")] - raw[(2, "leace_matched", "lm_loss_delta")])
    assert r["rank"] == raw[(2, "leace", "rank")] and r["last_layer_acc"] == raw[(2, "leace", "last_layer_acc")]


def test_gating_summary_puts_random_heads_of_the_same_size_beside_each_role(run):
    g = _raw(run, "gating")
    s = views.gating_summary(run)
    assert list(s.columns) == ["model", "unit", "name", "n_gated", "task", "metric", "value", "layer", "random_mean",
                               "random_min", "random_max", "n_random", "gap"]
    assert set(s["unit"]) <= {"role", "family"} and set(s["metric"]) == {"lm_loss_delta", "max_acc_drop"}
    row = s[(s["unit"] == "family") & (s["task"] == "pos")].iloc[0]
    unit = g[(g["unit"] == "family") & (g["name"] == row["name"]) & (g["task"] == "pos") & (g["metric"] == "probe_acc_delta")]
    assert row["value"] == -unit["value"].min() and row["layer"] == unit.loc[unit["value"].idxmin(), "layer"]
    rand = g[(g["unit"] == "random") & (g["n_gated"] == row["n_gated"]) & (g["task"] == "pos")
             & (g["metric"] == "probe_acc_delta")]
    per_draw = -rand.groupby("draw")["value"].min()
    assert row["n_random"] == 2 and row["random_mean"] == pytest.approx(per_draw.mean())
    assert (row["random_min"], row["random_max"]) == (per_draw.min(), per_draw.max())
    lm = s[(s["unit"] == "role") & (s["metric"] == "lm_loss_delta")].iloc[0]
    raw_lm = g[(g["unit"] == "role") & (g["name"] == lm["name"]) & (g["metric"] == "lm_loss_delta")]["value"]
    assert lm["task"] == "lm" and lm["value"] == raw_lm.iloc[0] and lm["gap"] == pytest.approx(lm["value"] - lm["random_mean"])


def test_gating_summary_band_by_hand():
    """The tiny model's only role covers every head, so its random sets are alike; here they differ."""
    cols = ["model", "unit", "name", "gate_layer", "gate_head", "n_gated", "draw", "task", "layer", "metric", "value"]
    rows = [("m", "role", "syn", -1, -1, 2, -1, "lm", -1, "lm_loss_delta", 0.5),
            ("m", "role", "one", -1, -1, 1, -1, "lm", -1, "lm_loss_delta", 0.1)]
    rows += [("m", "random", "size 2", -1, -1, 2, d, "lm", -1, "lm_loss_delta", v) for d, v in enumerate([0.1, 0.3, 0.2])]
    rows += [("m", "role", "syn", -1, -1, 2, -1, "pos", l, "probe_acc_delta", v) for l, v in ((1, -0.2), (2, -0.05))]
    s = views.gating_summary_frame(pd.DataFrame(rows, columns=cols)).set_index(["name", "metric"])
    syn = s.loc[("syn", "lm_loss_delta")]
    assert (syn["random_min"], syn["random_max"], syn["n_random"]) == (0.1, 0.3, 3)
    assert syn["random_mean"] == pytest.approx(0.2) and syn["gap"] == pytest.approx(0.3)
    assert s.loc[("syn", "max_acc_drop"), "value"] == 0.2 and s.loc[("syn", "max_acc_drop"), "layer"] == 1
    assert s.loc[("one", "lm_loss_delta"), "n_random"] == 0 and np.isnan(s.loc[("one", "lm_loss_delta"), "gap"])


def test_head_passport_and_its_grid(run):
    p = views.head_passport(run)
    pd.testing.assert_frame_equal(p, _raw(run, "head_passport"))
    assert {"role", "roles", "lm_loss_delta", "pos_acc_delta", "ner_max_drop", "pos_max_drop_layer"} <= set(p.columns)
    grid = views.passport_grid(p, "tiny")
    r = p.iloc[-1]
    assert grid.values.shape == (2, 2) and grid.values[r["layer"], r["head"]] == r["lm_loss_delta"]


def test_structural_summary_means_over_seeds_with_min_and_max(run):
    raw = _raw(run, "probing")
    s = views.structural_summary(run)
    assert list(s.columns) == ["model", "task", "metric", "layer", "value", "min", "max", "n_seeds"]
    assert set(zip(s["task"], s["metric"])) == {("structural_distance", "uuas"), ("structural_distance", "dspr"),
                                                ("structural_depth", "root_acc"), ("structural_depth", "nspr")}
    r = s[(s["metric"] == "uuas") & (s["layer"] == 1)].iloc[0]
    seeds = raw[(raw["metric"] == "uuas") & (raw["layer"] == 1) & (raw["seed"] >= 0) & (raw["mode"] == "single")]["value"]
    assert r["n_seeds"] == 2 and r["value"] == pytest.approx(seeds.mean())
    assert (r["min"], r["max"]) == (seeds.min(), seeds.max())
    # the Layers page's default metric is a headline one, never a Spearman correlation
    assert views.probing_metrics(run)[:2] == ["uuas", "root_acc"]


# -------------------------------------------------------------------------------------- figures
def test_figures_draw_the_summaries(run, tmp_path):
    am = views.amnesic_summary(run)
    fig = F.amnesic_figure(am)
    erased = next(t for t in fig.data if t.name == "tiny leace")
    control = next(t for t in fig.data if t.name == "tiny leace matched random")
    same_rank = next(t for t in fig.data if t.name == "tiny leace random, same rank")
    assert list(erased.y) == list(am["lm_loss_delta"]) and list(control.y) == list(am["lm_loss_delta_matched"])
    assert list(same_rank.y) == list(am["lm_loss_delta_same_rank"])
    assert control.line.dash == "dash" and same_rank.line.dash == "dot"
    st = F.structural_figure(views.structural_summary(run), views.STRUCTURAL_METRICS)
    uuas = next(t for t in st.data if t.name == "tiny uuas")
    assert len(st.data) == 4 and list(uuas.x) == [0, 1, 2]
    grid = F.passport_figure(views.passport_grid(views.head_passport(run), "tiny"))
    assert grid.data[0].zmid == 0 and np.asarray(grid.data[0].z).shape == (2, 2)
    gs = views.gating_summary(run)
    gf = F.gating_figure(gs, "tiny")
    bars = [t for t in gf.data if t.type == "bar"]
    assert len(bars) == 3 and len(gf.data) == 6     # lm, pos, ner panels: the unit's bars and the random marker
    # the figures the commands write beside the tables (`write_analysis_figures`)
    tables = {n: _raw(run, n) for n in ("amnesic", "gating", "head_passport", "probing")}
    names = {p.name for kind in ("amnesic", "gate", "probe") for p in AF.write_analysis_figures(kind, tables, tmp_path)}
    assert names == {"amnesic.json", "gating_units_tiny.json", "gating_heads_tiny.json", "probing_structural_tiny.json"}
    back = plotly.io.from_json((tmp_path / "figures" / "probing_structural_tiny.json").read_text())
    assert {t.name for t in back.data} == {"tiny uuas", "tiny dspr", "tiny root_acc", "tiny nspr"}


# --------------------------------------------------------------------------------------- report
def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n\n", 1)[1].split("\n## ", 1)[0]


def test_report_sections_carry_the_tables_numbers(run, md):
    s = views.structural_summary(run)
    uuas = s[s["metric"] == "uuas"].loc[lambda d: d["value"].idxmax()]
    text = _section(md, "Structural probes")
    assert (f"structural_distance peaks at layer {uuas['layer']} (uuas {_f(uuas['value'])} "
            f"[{_f(uuas['min'])}, {_f(uuas['max'])}]") in text
    assert "## Per-layer probing\n\n- The probing table holds only structural probes" in md

    am = views.amnesic_summary(run)
    top = am.loc[am["gap"].idxmax()]
    text = _section(md, "Amnesic probing")
    assert (f"at layer {top['layer']}: by {_f(top['lm_loss_delta'])} against {_f(top['lm_loss_delta_matched'])} "
            f"(gap {_f(top['gap'])}") in text
    assert f"displacement {_f(top['displacement'])} and {_f(top['displacement_matched'])}" in text
    assert f"scores {_f(top['probe_acc'])}, against {_f(top['probe_acc_intact'])} intact" in text

    p = views.head_passport(run)
    worst = p.loc[p["lm_loss_delta"].idxmax()]
    text = _section(md, "Head gating")
    assert f"gating layer {worst['layer']} head {worst['head']} alone costs the LM most" in text
    g = views.gating_summary(run)
    lm = g[g["metric"] == "lm_loss_delta"].iloc[0]
    assert f"against {_f(lm['random_mean'])} [{_f(lm['random_min'])}, {_f(lm['random_max'])}] for 2 random sets" in text
    # one key finding per causal section, at the top
    keys = md.split("## Key findings\n\n", 1)[1].split("\n\n", 1)[0]
    for title in ("Structural probes", "Amnesic probing", "Head gating"):
        assert keys.count(f"({title})") == 1


def test_report_names_the_commands_without_the_tables(tmp_path):
    run = make_results_fixture(tmp_path, n_layers=4, n_heads=2, checkpoints=False)
    md = report.write_report(run)[1].read_text()
    assert "No amnesic table yet: run `workbench amnesic MODEL --out RUN_FOLDER`." in _section(md, "Amnesic probing")
    assert "No gating, head_passport tables yet: run `workbench gate MODEL" in _section(md, "Head gating")
    # the fixture has edge-probing rows only: the section says which tasks to add (not a key finding)
    assert "has no structural-probe rows (add the tasks structural_distance and structural_depth" in md
    head = md.split("## Run", 1)[0]
    assert "(Amnesic probing)" not in head and "(Structural probes)" not in head
    (run / "tables" / "probing.parquet").unlink()
    md = report.write_report(run)[1].read_text()
    assert ("run `workbench probe MODEL --tasks structural_distance,structural_depth`"
            in _section(md, "Structural probes"))


def test_amnesic_faces_without_lm_rows(run, tmp_path):
    """A model whose LM head is untrained (an imported sentence encoder) has no LM-loss rows: the view
    gives NaN gaps, the figure draws the downstream probe, the report says so with its numbers."""
    raw = _raw(run, "amnesic")
    no_lm = raw[~raw["metric"].isin(["lm_loss", "lm_loss_delta"])]
    s = views.amnesic_summary_frame(no_lm)
    assert s["gap"].isna().all() and s["last_layer_acc"].notna().all()
    fig = F.amnesic_figure(s)
    assert fig.layout.yaxis.title.text == "last_layer_acc"
    assert [list(t.y) for t in fig.data][0] == list(s.sort_values("layer")["last_layer_acc"])
    results.write_table(tmp_path, "amnesic", no_lm)
    text = " ".join(report.amnesic_section(tmp_path).findings)
    top = s.loc[(s["last_layer_acc_matched"] - s["last_layer_acc"]).idxmax()]
    assert "its LM head is untrained" in text and _f(top["last_layer_acc"]) in text


def test_an_amnesic_table_from_before_the_matched_control_reads_as_same_rank(run):
    """A table written before the matched control (eraser "leace_random" = the same-rank control, no
    seed or displacement rows): the view names its control same_rank, the gap stays NaN, and the
    report's clause says the control is not moved as far, with the same-rank numbers."""
    raw = _raw(run, "amnesic")
    old = raw[raw["eraser"].isin(["none", "leace", "leace_same_rank"])
              & ~raw["metric"].isin(["displacement", "displacement_sq"]) & (raw["seed"] <= 0)]
    old = old.drop(columns="seed").replace({"eraser": {"leace_same_rank": "leace_random"}})
    s = views.amnesic_summary_frame(old)
    assert "probe_acc_matched" not in s and s["gap"].isna().all()
    first = raw[(raw["eraser"] == "leace_same_rank") & (raw["seed"] == 0) & (raw["metric"] == "lm_loss_delta")]
    assert list(s["lm_loss_delta_same_rank"]) == list(first.sort_values("layer")["value"])
    text = report._amnesic_clause("tiny", "pos", "leace", s)
    top = s.loc[(s["lm_loss_delta"] - s["lm_loss_delta_same_rank"]).idxmax()]
    assert "same rank, not moved as far: this run has no matched control" in text
    assert f"by {_f(top['lm_loss_delta'])} against {_f(top['lm_loss_delta_same_rank'])}" in text
