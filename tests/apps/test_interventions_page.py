"""The Interventions page under Streamlit's AppTest, on the tables `interventions_model` really writes
(a tiny decoder whose tokenizer keeps the agreement items, tests/workbench/analyses/agreement_runs.py,
added to the results fixture): the run's three figures beside both floors, then one picked item and
site whose bars are `item_effect`'s numbers, and the site choice is what is patched; on a model
without tables the page names the command and still draws one item's effect."""

from __future__ import annotations

import plmodels
import pytest

from tests.apps.fixtures import app_page, make_results_fixture
from tests.workbench.analyses.agreement_runs import agreement_run
from workbench.analyses.interventions import InterventionsConfig, item_effect, kept_items, mediation_sites
from workbench.figures.interventions import ITEM_BARS, LINES


@pytest.fixture(scope="module")
def iv_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("iv_results")
    run = make_results_fixture(root, n_layers=2, n_heads=2)
    agreement_run(run)
    return root


@pytest.mark.slow
def test_the_page_draws_the_run_and_one_items_effect_at_the_picked_site(monkeypatch, iv_root):
    at = app_page(monkeypatch, iv_root, "app_pages/interventions.py")
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Interventions" and not at.info and not at.error
    assert at.selectbox(key="interventions_model").value.startswith("agr-dec")  # the model with results first
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert len(specs) == 4
    assert all(words in specs[i] for i in range(3) for words, _, _ in LINES.values())
    assert len(at.dataframe) == 1  # attribution patching against real patching

    # the item's bars are item_effect's log-probability differences at the chosen site
    m, tok = plmodels.load(iv_root / "demo" / "models" / "agr-dec")
    cfg = InterventionsConfig()
    record, _ = kept_items(m, tok, "swap_number", cfg)[0]
    sites = mediation_sites(m, cfg)
    at.selectbox(key="interventions_site").select(sites[-1].label).run()
    assert not at.exception
    bars = at.get("plotly_chart")[3].proto.spec
    want = item_effect(m, tok, record, "swap_number", sites[-1]).set_index("quantity")["value"]
    assert all(f"{want[k]:.4f}" in bars for k in ITEM_BARS)
    assert want["d_noised"] == pytest.approx(want["d_intervened"], abs=1e-6)  # the last block's readout
    at.selectbox(key="interventions_site").select(sites[0].label).run()
    assert at.get("plotly_chart")[3].proto.spec != bars and sites[0].label in at.get("plotly_chart")[3].proto.spec
    at.selectbox(key="interventions_kind").select("same_number").run()  # the control's items, its own list
    assert not at.exception and at.selectbox(key="interventions_item").options[0].split(": ")[1] == (
        " ".join(kept_items(m, tok, "same_number", cfg)[0][0].good) + " -> "
        + " ".join(kept_items(m, tok, "same_number", cfg)[0][1]))


def test_a_model_without_tables_names_the_command(monkeypatch, results_root):
    at = app_page(monkeypatch, results_root, "app_pages/interventions.py")
    assert not at.exception, [e.value for e in at.exception]
    assert any("workbench patch MODEL" in i.value for i in at.info), [i.value for i in at.info]
    # the fixture's tiny tokenizers split the subjects differently by number: aligned by word, the items
    # are kept, so one item's effect is drawn without the run's tables
    assert not at.warning, [w.value for w in at.warning]
    charts = at.get("plotly_chart")
    assert len(charts) == 1 and all(words in charts[0].proto.spec for words in ITEM_BARS.values())
