"""The analysis registry (workbench/analyses/registry.py) is the one place `workbench run`, the app's
views and the figure writer learn of an analysis: a record planted in it gets a step that calls its
run function with a typed config, every table it names gets its command, and the figure builder it
names draws its figures (a key no builder has, or a builder no record names, is refused by name)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io
import pytest

from plmodels import save
from plmodels.config import Config
from plmodels.tokenizer import Tokenizer
from workbench import cli, pipeline
from workbench.analyses import registry
from workbench.analyses.probing import ProbeRunConfig
from workbench.analyses.registry import ANALYSES, Analysis, Where
from workbench.core.results import write_table
from workbench.presentation import analysis_figures, report, views

from ...plmodels.tiny import tiny_encoder


@dataclass(frozen=True)
class PlantedConfig(Config):
    width: int = 3


def _planted(calls: list) -> Analysis:
    def run(source: Path, config: Config, where: Where) -> dict[str, pd.DataFrame]:
        calls.append((source, config, where))
        return {"planted": pd.DataFrame({"model": [where.model_name], "value": [config.width]})}
    return Analysis("planted", PlantedConfig, run, ("planted",), "workbench planted MODEL")


def test_a_planted_record_gets_a_step_that_runs_it_with_a_typed_config(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(ANALYSES, "planted", _planted(calls))
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    cfg = {"name": "r", "seed": 0, "models": {"m": {"import": "x"}},
           "planted": {"models": ["m"], "config": {"width": 7}}}
    steps = {s.name: s for s in pipeline.build_steps(cfg)}
    assert steps["planted:m"].after == ["import:m"]
    out = steps["planted:m"].fn(pipeline.Context(tmp_path, cfg, steps["planted:m"].params))
    assert out == {"tables": ["planted"]}
    (source, config, where), = calls
    assert source == tmp_path / "models" / "m" and config == PlantedConfig(width=7)
    assert where.out_dir == tmp_path / "planted" / "m" and where.model_name == "m"
    assert pd.read_parquet(tmp_path / "tables" / "planted.parquet")["value"].tolist() == [7]


def test_a_planted_records_config_is_checked_before_the_run(monkeypatch):
    monkeypatch.setitem(ANALYSES, "planted", _planted([]))
    cfg = {"name": "r", "seed": 0, "models": {"m": {"import": "x"}},
           "planted": {"models": ["m"], "config": {"wdth": 7}}}
    with pytest.raises(ValueError, match=r"demo.json: planted.config: .*'wdth'"):
        pipeline.validate_run_config(cfg, "demo.json")


def test_step_fields_override_the_config_and_the_result_stays_typed(tmp_path):
    spec = {"models": ["m"], "tasks": ["pos"], "config": {"seeds": [0]}}
    config = pipeline.step_config(registry.analysis("probe"), spec)
    assert isinstance(config, ProbeRunConfig) and list(config.tasks) == ["pos"]
    assert list(config.seeds) == [0]


def test_every_run_config_section_is_a_registered_analysis_or_a_named_step():
    fields = set(pipeline.RunConfig.__dataclass_fields__)
    assert set(ANALYSES) <= fields
    others = {"name", "seed", "models", "results_root", "tasks", "finetune", "compare", "competence", "report", "zoo",
              "workers"}
    assert fields - set(ANALYSES) == others


def test_views_are_keyed_by_registered_analyses():
    for record in ANALYSES.values():
        for table in record.tables:
            assert views.COMMANDS[table] == record.command


# analysis -> its figure builder before the records named them (analysis_figures.BUILDERS and PAGES,
# keyed by analysis name, at 991f9f4)
PRE_RECORD = {"probe": "probing_figures", "heads": "heads_figures", "amnesic": "amnesic_figures",
              "gate": "gating_figures", "flow": "flow_figures", "interventions": "interventions_figures",
              "emergence": "emergence_figures"}


def test_each_record_names_the_figure_builder_its_analysis_had():
    builders = analysis_figures.figure_builders()
    assert {name: b.draw.__name__ for name, b in builders.items()} == PRE_RECORD
    assert [name for name, b in builders.items() if b.page] == ["emergence"]   # was PAGES


def test_a_planted_records_builder_draws_its_figures(tmp_path, monkeypatch):
    def planted(tables):
        t = tables["planted"]
        return {f"planted_{m}": go.Figure(go.Bar(y=t[t["model"] == m]["value"].tolist())) for m in t["model"]}

    monkeypatch.setitem(ANALYSES, "planted", dataclasses.replace(_planted([]), figures="planted_figures"))
    monkeypatch.setitem(analysis_figures.BUILDERS, "planted_figures", analysis_figures.FigureBuilder(planted))
    table = pd.DataFrame({"model": ["m"], "value": [7]})
    written = analysis_figures.write_analysis_figures("planted", {"planted": table}, tmp_path)
    assert written == [tmp_path / "figures" / "planted_m.json"]
    assert list(plotly.io.from_json(written[0].read_text()).data[0].y) == [7]
    monkeypatch.setitem(analysis_figures.BUILDERS, "planted_figures", analysis_figures.FigureBuilder(planted, page=True))
    written = analysis_figures.write_analysis_figures("planted", {"planted": table}, tmp_path / "page")
    assert written == [tmp_path / "page" / "planted_m.html"] and "Plotly.newPlot" in written[0].read_text()
    with pytest.raises(ValueError, match="unknown analysis 'plantd'"):
        analysis_figures.write_analysis_figures("plantd", {"planted": table}, tmp_path)


def test_a_record_naming_an_unknown_builder_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setitem(ANALYSES, "planted", dataclasses.replace(_planted([]), figures="nowhere"))
    with pytest.raises(ValueError, match=r"unknown \['planted: nowhere'\], named by no analysis record \[\]"):
        analysis_figures.write_analysis_figures("probe", {}, tmp_path)


def test_a_builder_no_record_names_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setitem(analysis_figures.BUILDERS, "orphan", analysis_figures.BUILDERS["heads"])
    with pytest.raises(ValueError, match=r"unknown \[\], named by no analysis record \['orphan'\]"):
        analysis_figures.figure_builders()
    # a record without figures writes none, however its tables look
    monkeypatch.delitem(analysis_figures.BUILDERS, "orphan")
    assert analysis_figures.write_analysis_figures("prune", {"pruning": pd.DataFrame()}, tmp_path) == []
    assert not (tmp_path / "figures").exists()


def test_an_unknown_analysis_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown analysis 'probes'; known: probe, heads"):
        registry.analysis("probes")


def test_a_misspelt_key_of_an_analysis_section_is_refused_naming_the_sections_keys():
    cfg = {"name": "r", "seed": 0, "models": {"m": {"import": "x"}}, "probe": {"models": ["m"], "taks": ["pos"]}}
    with pytest.raises(ValueError, match=r"demo.json: unknown key 'probe.taks' \(known: models, config, tasks,"):
        pipeline.RunConfig.from_dict(cfg, "demo.json")
    cfg["probe"] = {"models": ["m"], "tasks": ["pos"]}
    assert pipeline.RunConfig.from_dict(cfg, "demo.json").probe.tasks == ["pos"]


def test_a_key_of_another_analysis_section_is_refused_by_the_records_fields():
    # `tasks` is a step field of probe, not of heads: the schema holds it, the record refuses it
    cfg = {"name": "r", "seed": 0, "models": {"m": {"import": "x"}}, "heads": {"models": ["m"], "tasks": ["pos"]}}
    pipeline.RunConfig.from_dict(cfg, "demo.json")
    with pytest.raises(ValueError, match=r"demo.json: heads: unknown keys \['tasks'\]; a heads section takes "
                                         r"models, config, app_sentences"):
        pipeline.validate_run_config(cfg, "demo.json")


def test_every_records_section_fields_are_fields_of_the_section_schema():
    schema = set(pipeline.AnalysisSection.__dataclass_fields__)
    for record in ANALYSES.values():
        assert set(pipeline.section_fields(record)) <= schema, record.name
        assert pipeline.RunConfig.__dataclass_fields__[record.name].type == pipeline.AnalysisSection | None


# ------------------------------------------------------------- a planted record: its schema, subcommand, report
PLANTED_RUN = {"name": "r", "seed": 0, "models": {"m": {"import": "x"}}, "planted": {"models": ["m"]}}


def test_a_planted_record_has_its_run_config_section_without_an_edit_of_the_schema(monkeypatch):
    with pytest.raises(ValueError, match=r"demo.json: unknown key 'planted'"):
        pipeline.run_config_class().from_dict(PLANTED_RUN, "demo.json")
    monkeypatch.setitem(ANALYSES, "planted", _planted([]))
    schema = pipeline.run_config_class()
    assert schema.from_dict(PLANTED_RUN, "demo.json").planted == pipeline.AnalysisSection(models=["m"])
    with pytest.raises(ValueError, match=r"demo.json: unknown key 'planted.confg' \(known: models, config,"):
        schema.from_dict({**PLANTED_RUN, "planted": {"models": ["m"], "confg": {}}}, "demo.json")
    assert schema.from_dict({"name": "r", "seed": 0, "models": {}}, "demo.json").planted is None


def test_every_records_section_is_generated_and_the_run_config_has_no_other_section():
    # the written-out fields are RunConfigBase's; every analysis section comes from a record
    written = set(pipeline.RunConfigBase.__dataclass_fields__)
    assert not written & set(ANALYSES)
    assert set(pipeline.run_config_class().__dataclass_fields__) == written | set(ANALYSES)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    texts = ["the cat sat on the mat", "a dog ran in the park"] * 5
    tok = Tokenizer.train_wordpiece(texts, vocab_size=61)
    return save(tiny_encoder(vocab_size=tok.vocab_size), tok, tmp_path_factory.mktemp("ckpt") / "model")


def test_a_planted_record_has_its_subcommand_with_config_and_set(monkeypatch, capsys, checkpoint, tmp_path):
    calls: list = []
    monkeypatch.setitem(ANALYSES, "planted", _planted(calls))
    assert cli.main(["planted", str(checkpoint), "--out", str(tmp_path / "o"), "--set", "width=5"]) == 0
    (source, config, where), = calls
    assert source == checkpoint and config == PlantedConfig(width=5) and where.out_dir == tmp_path / "o"
    assert "planted tables: ['planted']" in capsys.readouterr().out
    # the config is checked, by name, before the run
    assert cli.main(["planted", str(checkpoint), "--set", "wdth=5"]) == 1
    assert "--set wdth: unknown key (known: width)" in capsys.readouterr().err and len(calls) == 1
    # its --out defaults to runs/<name>, its help line is the record's
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices["planted"]
    assert sub.get_default("out") == Path("runs/planted")
    monkeypatch.setitem(ANALYSES, "planted", dataclasses.replace(_planted([]), help="a planted analysis"))
    assert "a planted analysis" in cli.build_parser().format_help()


def test_every_records_subcommand_is_in_the_parser_and_runs_it():
    choices = cli.build_parser()._subparsers._group_actions[0].choices
    for record in ANALYSES.values():
        sub = choices[record.subcommand]
        assert sub.get_default("fn") is cli._analysis and sub.get_default("analysis") == record.name
        assert sub.get_default("out") == Path("runs") / record.name


def test_a_planted_record_without_sections_gets_the_default_report_section(monkeypatch, tmp_path):
    def planted_figures(tables):
        return {"planted": go.Figure(go.Bar(y=tables["planted"]["value"].tolist()))}

    monkeypatch.setitem(ANALYSES, "planted", dataclasses.replace(_planted([]), figures="planted_figures"))
    monkeypatch.setitem(analysis_figures.BUILDERS, "planted_figures", analysis_figures.FigureBuilder(planted_figures))
    assert "default:planted" in report.section_keys()
    titles = [s.title for s in report.build_sections(tmp_path)]
    assert "Planted" not in titles   # no table written: no section, no notice
    write_table(tmp_path, "planted", pd.DataFrame({"model": ["m"] * 25, "value": range(25)}))
    section, = [s for s in report.build_sections(tmp_path) if s.title == "Planted"]
    (caption, table), = section.tables
    assert caption == "planted: the first 20 of 25 rows (tables/planted.parquet)"
    assert table["value"].tolist() == list(range(20))
    assert list(section.figs[0].data[0].y) == list(range(25)) and section.findings == []


def test_every_records_config_class_resolves_and_a_bad_reference_is_named():
    for record in ANALYSES.values():
        assert issubclass(record.config_class, Config) and record.resolve() == record.config_class.resolve()
    with pytest.raises(ValueError, match=r"'workbench.analyses.flow:NoSuchConfig': workbench.analyses.flow has no "
                                         r"NoSuchConfig"):
        registry.load_ref("workbench.analyses.flow:NoSuchConfig")
    with pytest.raises(ValueError, match="expected 'module:name'"):
        registry.load_ref("FlowRunConfig")
