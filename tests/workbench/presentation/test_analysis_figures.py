"""The figures `workbench run` writes beside each analysis' tables (workbench/presentation/analysis_figures.py)
on the tiny pipeline's own run (`tiny_run`, tests/conftest.py): drawn by the builder each analysis record
names, they are the files the dispatch by analysis name wrote before the records named their builders
(`BUILDERS` and `PAGES` at 991f9f4): the same names, and the same JSON and HTML from the same tables."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench import figures as F
from workbench.analyses.registry import ANALYSES
from workbench.core.results import load_table
from workbench.presentation import analysis_figures as AF

pytestmark = pytest.mark.slow   # the tiny pipeline runs once per session (`tiny_run`)

Draw = Callable[[Mapping[str, pd.DataFrame]], dict[str, go.Figure]]
# analysis -> (figures as JSON under figures/, or one HTML page named after the analysis), as at 991f9f4
BEFORE: dict[str, tuple[str, Draw]] = {
    "probe": ("json", AF.probing_figures), "heads": ("json", AF.heads_figures),
    "amnesic": ("json", AF.amnesic_figures), "gate": ("json", AF.gating_figures),
    "flow": ("json", AF.flow_figures), "interventions": ("json", AF.interventions_figures),
    "emergence": ("page", lambda tables: {"emergence": F.emergence_figure(tables["emergence"])}),
}


# plotly names a page's <div> with a fresh uuid4 at every to_html: the one part of a page that differs
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _before(kind: str, tables: Mapping[str, pd.DataFrame]) -> dict[str, str]:
    """File name (relative to the analysis' folder) -> text, as the dispatch by analysis name wrote them."""
    form, draw = BEFORE[kind]
    if form == "page":
        return {f"{kind}.html": UUID.sub("ID", draw(tables)[kind].to_html(include_plotlyjs=True, full_html=True))}
    return {f"figures/{name}.json": fig.to_json() for name, fig in draw(tables).items() if fig is not None}


def _files(folder: Path) -> dict[str, str]:
    paths = [*folder.glob("*.html"), *(folder / "figures").glob("*.json")]
    return {str(p.relative_to(folder)): UUID.sub("ID", p.read_text()) if p.suffix == ".html" else p.read_text()
            for p in paths}


def _model_tables(run: Path, kind: str, model: str) -> dict[str, pd.DataFrame]:
    """The tables analysis `kind` returned for `model`: its rows of the run's tables."""
    out = {}
    for name in ANALYSES[kind].tables:
        t = load_table(run, name)
        if t is not None and (t["model"] == model).any():
            out[name] = t[t["model"] == model].reset_index(drop=True)
    return out


def test_the_pipeline_writes_the_figures_it_wrote_before_the_records_named_their_builders(tiny_run, tmp_path):
    drawn = {kind: sorted(p.name for p in (tiny_run / kind).iterdir() if p.is_dir())
             for kind in BEFORE if (tiny_run / kind).is_dir()}
    assert drawn == {"probe": ["decoder", "encoder"], "heads": ["decoder", "encoder"], "amnesic": ["encoder"],
                     "gate": ["encoder"], "flow": ["decoder", "encoder"], "interventions": ["decoder", "encoder"],
                     "emergence": ["encoder"]}     # every analysis with figures ran in tiny.json
    for kind, models in drawn.items():
        for model in models:
            written = _files(tiny_run / kind / model)          # by the pipeline, through the record
            tables = _model_tables(tiny_run, kind, model)
            before = _before(kind, tables)
            assert sorted(written) == sorted(before) and written, (kind, model)
            new = tmp_path / kind / model
            AF.write_analysis_figures(kind, tables, new)
            assert _files(new) == before, (kind, model)     # same tables, same JSON / HTML
