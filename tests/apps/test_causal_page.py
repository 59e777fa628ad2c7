"""The Causal probes page under Streamlit's AppTest, on the tables the analyses really write (the
session's tiny EWT run of tests/workbench/presentation/test_causal_faces.py): every tab draws its
figure and table without an exception; on a run without those tables each tab names the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apps.fixtures import app_page
from tests.workbench.presentation.causal_run import causal_run
from workbench.core.paths import data_root
from workbench.core.results import write_table

TABS = ["Amnesic", "Head gating", "Passport", "Structural"]


def _page(monkeypatch, root: Path):
    return app_page(monkeypatch, root, "app_pages/causal.py")


@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_every_tab_draws_the_real_tables(monkeypatch, tmp_path_factory):
    run = causal_run(tmp_path_factory)
    at = _page(monkeypatch, run.parent)
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Causal probes" and [t.label for t in at.tabs] == TABS
    assert not at.info and not at.error
    charts = [c.proto.spec for c in at.get("plotly_chart")]
    # one figure a tab, and the Structural tab's second: the best layer beside its four floors
    assert len(charts) == 5 and len(at.dataframe) == 5
    for tab, title in zip(at.tabs, ("Amnesic probing", "gating head roles", "lm_loss_delta when the head alone",
                                    "Structural probes per layer")):
        assert title in tab.get("plotly_chart")[0].proto.spec, tab.label
    assert [len(tab.get("plotly_chart")) for tab in at.tabs] == [1, 1, 1, 2]
    floors = at.tabs[3].get("plotly_chart")[1].proto.spec
    assert "best layer beside the four floors" in floors and all(f in floors for f in ("random_tree", "chain", "position"))
    at.selectbox(key="causal_passport_column").select("pos_max_drop").run()
    assert not at.exception and "pos_max_drop when the head alone" in at.tabs[2].get("plotly_chart")[0].proto.spec


def test_every_tab_names_its_command_without_the_tables(monkeypatch, tmp_path):
    import pandas as pd

    write_table(tmp_path / "bare", "training", pd.DataFrame(
        {"model": ["m"], "step": [0], "tokens": [0], "split": ["train"], "metric": ["loss"], "value": [9.0]}))
    at = _page(monkeypatch, tmp_path)
    assert not at.exception and not at.get("plotly_chart")
    notices = [tab.info[0].value for tab in at.tabs]
    for notice, command in zip(notices, ("workbench amnesic MODEL", "workbench gate MODEL", "workbench gate MODEL",
                                         "workbench probe MODEL --tasks structural_distance,structural_depth")):
        assert notice.startswith("No ") and command in notice, notice
