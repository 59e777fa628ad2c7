"""The Objectives page under Streamlit's AppTest, on what `workbench zoo configs/zoo-tiny.json` really
writes (the session's `zoo_run`): every tab draws without an exception and names every system, each
task, x axis and CKA pair can be picked; a run without the zoo's tables says which command writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apps.fixtures import app_page
from workbench.core import results
from workbench.presentation import views

SYSTEMS = ["bert", "bert-rope", "elmo", "t5"]   # configs/zoo-tiny.json


def _page(monkeypatch, root: Path):
    return app_page(monkeypatch, root, "app_pages/objectives.py")


@pytest.mark.slow
def test_the_page_draws_every_system_of_the_zoo(monkeypatch, zoo_run):
    at = _page(monkeypatch, zoo_run.parent)
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Objectives" and [t.label for t in at.tabs] == ["Layers", "Comparisons", "Head roles",
                                                                                 "CKA"]
    assert not at.info and not at.error
    layers_tab, comparisons_tab, _, cka_tab = at.tabs
    chart = layers_tab.get("plotly_chart")[0].proto.spec
    assert all(f'"name":"{s}"' in chart for s in SYSTEMS)
    summary = layers_tab.dataframe[0].value
    assert sorted(summary["system"]) == SYSTEMS and summary["task"].nunique() == 1
    shown = comparisons_tab.dataframe[0].value       # the first task's comparisons and the task-free ones
    raw = results.load_table(zoo_run, "zoo_comparisons")
    raw = raw[raw["task"].isin([summary["task"].iloc[0], ""])]
    assert len(shown) == len(raw)
    assert sorted(shown[shown["disagree"] != ""]["disagree"]) == sorted(
        f"{f} of {n} seed pairs disagree" for f, n in zip(raw["flips"], raw["n_seed_pairs"]) if f > 0)
    assert bool(at.warning) == bool((raw["flips"] > 0).any())
    assert {"finding", "unadjusted", "p_holm", "seeds", "contrast", "compute"} <= set(shown.columns)
    assert (shown["seeds"] == "2: too few to claim").all() and (shown["finding"] == "no claim").all()
    assert "seed-averaged" in cka_tab.get("plotly_chart")[0].proto.spec
    for task in views.zoo_tasks(zoo_run):
        at.selectbox(key="obj_task").select(task).run()
        at.selectbox(key="obj_x").select("relative depth (layer / L)").run()
        metric = "UUAS" if task == "structural_distance" else "micro F1"   # the structural probe's own metric
        assert not at.exception and f"{task}: {metric} by layer" in at.tabs[0].get("plotly_chart")[0].proto.spec
    for pair in at.selectbox(key="obj_cka_pair").options:
        at.selectbox(key="obj_cka_pair").select(pair).run()
        a, b = pair.split(" vs ")
        assert not at.exception and f"Linear CKA: {a} vs {b}" in at.tabs[3].get("plotly_chart")[0].proto.spec


def test_a_run_without_the_zoo_says_what_to_run(monkeypatch, partial_root):
    at = _page(monkeypatch, partial_root)
    assert not at.exception and not at.get("plotly_chart")
    assert at.title[0].value == "Objectives"
    assert [i.value for i in at.info] == ["No zoo results in this run yet. Produce them with `workbench zoo CONFIG`."]
