"""The interventions analysis' faces (workbench/figures/interventions.py, the report's
interventions_section, the figures written beside a run's tables) on the tables `interventions_model`
really writes for a tiny decoder: every point drawn is its table row with its interval, beside the
random-init model and the same-number control; the report's reading follows the floors."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.workbench.analyses.agreement_runs import agreement_run
from workbench.core.results import load_table
from workbench.figures.interventions import (LINES, interventions_heads_figure, interventions_layers_figure,
                                             interventions_positions_figure)
from workbench.presentation import analysis_figures
from workbench.presentation.report import interventions_section


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("iv") / "run"
    agreement_run(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def table(run):
    return load_table(run, "interventions")


def _trace(fig, name: str, panel: int | None = None):
    traces = [t for t in fig.data if t.name == name]
    return traces if panel is None else [t for t in traces if t.xaxis == ("x" if panel == 1 else f"x{panel}")]


def test_the_layer_figure_draws_each_sites_nie_with_its_interval_beside_both_floors(table):
    fig = interventions_layers_figure(table, "agr-dec")
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == ["residual stream at the subject", "attention output", "MLP output",
                          "residual stream at the reading position"]
    for (variant, intervention), (words, _, _) in LINES.items():
        (tr,) = _trace(fig, words, panel=3)  # the MLP output
        want = table[(table.variant == variant) & (table.intervention == intervention) & (table.metric == "nie_log")
                     & (table.site_kind == "mlp_out") & (table.position == "all")].sort_values("layer")
        np.testing.assert_allclose(tr.y, want["value"])
        np.testing.assert_allclose(np.asarray(tr.y) + np.asarray(tr.error_y.array), want["ci_high"])
        np.testing.assert_allclose(np.asarray(tr.y) - np.asarray(tr.error_y.arrayminus), want["ci_low"])
    te = table[(table.site == "input") & (table.metric == "te_log") & (table.variant == "trained")
               & (table.intervention == "swap_number")]["value"].iloc[0]
    assert f"te_log {te:.3f}" in fig.layout.title.text
    assert fig.layout.shapes[0].y0 == pytest.approx(te)  # the total effect as the reference line


def test_the_head_figure_draws_every_head_in_forward_order(table):
    fig = interventions_heads_figure(table, "agr-dec")
    (tr,) = _trace(fig, LINES[("random_init", "swap_number")][0])
    assert list(tr.x) == ["L0.H0", "L0.H1", "L1.H0", "L1.H1"]
    want = table[(table.variant == "random_init") & (table.intervention == "swap_number") & (table.metric == "nie_log")
                 & (table["head"] >= 0) & (table.position == "all")].sort_values(["layer", "head"])["value"]
    np.testing.assert_allclose(tr.y, want)


def test_the_position_grid_draws_every_site_at_every_position_beside_both_floors(table):
    fig = interventions_positions_figure(table, "agr-dec")
    assert [t.name for t in fig.data] == [None] * 3 and [a.text for a in fig.layout.annotations] == [
        words for words, _, _ in LINES.values()]
    for tr, (variant, intervention) in zip(fig.data, LINES):
        assert list(tr.x) == ["all", "reading", "subject"]
        assert list(tr.y) == [f"L{l}{s}" for l in (0, 1) for s in (" attn_out", ".H0", ".H1", " mlp_out", " resid_post")]
        g = table[(table.variant == variant) & (table.intervention == intervention) & (table.metric == "nie_log")]
        for (i, label), (j, position) in ((a, b) for a in enumerate(tr.y) for b in enumerate(tr.x)):
            l, rest = int(label[1]), label[2:]
            kind, head = (("head_out", int(rest[2])) if rest.startswith(".H") else (rest.strip(), -1))
            want = g[(g.layer == l) & (g.site_kind == kind) & (g["head"] == head) & (g.position == position)]
            if want.empty:  # the residual stream at every position is not drawn apart from its positions
                assert np.isnan(tr.z[i][j]) or kind == "resid_post"
            else:
                assert tr.z[i][j] == pytest.approx(want["value"].item())
                assert f"[{want['ci_low'].item():.4f}, {want['ci_high'].item():.4f}]" in tr.text[i][j]


def test_the_figure_writer_draws_the_three_figures_per_model(table):
    figs = analysis_figures.BUILDERS["interventions"]({"interventions": table})
    assert sorted(figs) == ["interventions_heads_agr-dec", "interventions_layers_agr-dec",
                            "interventions_positions_agr-dec"]


def test_the_report_reads_the_total_effect_beside_its_floors(run, table):
    s = interventions_section(run)
    assert len(s.figs) == 3 and not s.missing
    te, sites, positions = s.findings
    row = table[(table.site == "input") & (table.metric == "te_log") & (table.variant == "random_init")].iloc[0]
    assert f"random init {row.value:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]" in te
    assert "same-number control" in te and "it clears" in te
    # 30 sites (2 blocks x (2 heads, attn_out, mlp_out, resid_post) at every position and at each of 2);
    # left out as the whole intervention by construction: the residual stream at every position after
    # each of the 2 blocks, and the last block's output at the reading position
    assert "of 27 sites" in sites
    # per position, the largest head or sub-layer NIE of the 8 there, beside its floors
    nie = table[(table.metric == "nie_log") & (table.variant == "trained") & (table.intervention == "swap_number")
                & (table.position == "reading") & (table.site_kind != "resid_post")]
    best = nie.sort_values("value").iloc[-1]
    assert f"at the reading position {best.site} {best.value:.3f} [{best.ci_low:.3f}, {best.ci_high:.3f}] nats of 8 " \
           "sites" in positions and "at the subject position" in positions


def _planted(carried: float, total: float = 1.0) -> pd.DataFrame:
    """Three sites of one layer of one model; site "a" carries `carried` nats on the trained model, every
    floor 0; the trained model's TE is `total`; "r", the whole residual stream, has NIE = TE."""
    rows = []
    for variant, intervention in LINES:
        for site, kind in (("a", "attn_out"), ("b", "mlp_out"), ("r", "resid_post")):
            v = carried if (variant, intervention, site) == ("trained", "swap_number", "a") else 0.0
            v = total if site == "r" else v  # the whole residual stream: NIE = TE, left out of the reading
            rows.append(("m", variant, intervention, site, kind, 0, -1, "all", "nie_log", v, v - 0.1, v + 0.1, 20, 0))
        te = total if (variant, intervention) == ("trained", "swap_number") else 0.0
        rows += [("m", variant, intervention, "input", "input", -1, -1, "all", "te_log", te, te - 0.1, te + 0.1, 20, 0),
                 ("m", variant, intervention, "input", "input", -1, -1, "all", "accuracy_clean", .9, .8, 1., 20, 0)]
    return pd.DataFrame(rows, columns=["model", "variant", "intervention", "site", "site_kind", "layer", "head",
                                       "position", "metric", "value", "ci_low", "ci_high", "n_items", "seed"])


@pytest.mark.parametrize("carried, total, clears, words", [
    (0.5, 1.0, "both floors", "1 of 2 sites carry an indirect effect above their floors' intervals (nats): "
                              "a 0.500 [0.400, 0.600]"),
    (0.15, 1.0, "both floors", "no site's indirect effect clears its floors' intervals"),
    # a site above its floors while the total effect is not: named, and not read as a mechanism
    (0.5, 0.05, "no floor", "1 of 2 sites have an indirect effect above their floors' intervals (nats: a 0.500"),
])
def test_the_report_names_the_sites_above_the_floors_or_says_none_is(tmp_path, carried, total, clears, words):
    from workbench.core.results import write_table
    write_table(tmp_path, "interventions", _planted(carried, total))
    te, sites = interventions_section(tmp_path).findings
    assert f"{total:.3f} [{total - 0.1:.3f}, {total + 0.1:.3f}] nats" in te and te.endswith(f"it clears {clears}")
    assert words in sites
    assert ("not read as an agreement mechanism" in sites) == (clears != "both floors" and carried > 0.2)


def test_without_the_table_the_section_names_it(tmp_path):
    assert interventions_section(tmp_path).missing == ["interventions"]
