"""workbench.presentation.report: the self-contained HTML report and its Markdown summary, on the app's results
fixture with planted values (peak layers, best heads, pruning curves whose 1 % / 5 % answers are
computed by hand below), on a run with only some tables, and on training curves read from
metrics.jsonl files."""

from __future__ import annotations

import dataclasses
import json
import re
from html import escape

import numpy as np
import pandas as pd
import pytest

from tests.apps.fixtures import PEAK_LAYER, make_results_fixture
from workbench.analyses.registry import ANALYSES
from workbench.core import results
from workbench.presentation import report

TITLES = ["Run", "Models and training", "Per-layer probing", "Attention heads", "Head importance and pruning",
          "Frozen vs finetuned"]
N_LAYERS, N_HEADS = 12, 6


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The fixture run with one planted change: `obj` gets the clearly best head (layer 4, head 1)."""
    run = make_results_fixture(tmp_path_factory.mktemp("res"), n_layers=N_LAYERS, n_heads=N_HEADS, checkpoints=False)
    rel = results.load_table(run, "relations")
    obj = rel["relation"] == "obj"
    rel.loc[obj, ["test_acc", "ci_low", "ci_high"]] = [0.95, 0.91, 0.98]
    results.write_table(run, "relations", rel)
    html_path, md_path = report.write_report(run)
    return run, html_path.read_text(), md_path.read_text()


def _finding(md: str, title: str) -> str:
    """The findings of a section in summary.md (the bullet list after its heading), as one text."""
    body = md.split(f"## {title}\n\n", 1)[1]
    return body.split("\n\n", 1)[0]


def test_report_has_every_section_and_embeds_plotly_once_without_network(full):
    run, html, md = full
    for t in TITLES:
        anchor = "sec-" + re.sub(r"[^a-z0-9]+", "-", t.lower()).strip("-")
        assert f'<h2 id="{anchor}">{t}</h2>' in html and f"## {t}" in md
        assert f'<li><a href="#{anchor}">{t}</a></li>' in html                 # the table of contents
    assert html.count("* plotly.js v") == 1                       # the bundle's licence header, once
    assert html.count("Plotly.newPlot(") >= 12                    # every figure drawn by that one bundle
    # plotly.js itself holds URLs (map tiles, topojson and icon CDNs, its logo link) used only by map
    # traces and the mode bar, never fetched for these figures; outside the bundle nothing may.
    from plotly.offline import get_plotlyjs
    outside = html.replace(get_plotlyjs(), "")
    assert len(outside) < len(html) - 1_000_000                                  # the bundle was there
    assert not re.search(r"<script[^>]+src=", html)                              # no script is fetched
    assert not re.search(r"(src|href)=[\"']?https?:", outside) and "https://cdn" not in outside
    assert html.count("<script") == 1 + html.count("Plotly.newPlot(")           # bundle + one per figure
    assert "[report.html](report.html)" in md


def test_probing_sentence_carries_the_planted_peaks_and_the_table_numbers(full):
    run, html, md = full
    sentence = _finding(md, "Per-layer probing")
    summary = results.load_table(run, "probing_summary").set_index(["model", "task", "metric"])["value"]
    for task, layer in PEAK_LAYER.items():
        assert f"{task} peaks at layer {layer} (accuracy 0.900" in sentence      # enc: 0.9 at the planted layer
        el = summary[("enc", task, "expected_layer")]
        assert f"{task} {el:.2f}" in sentence.split("orders its tasks", 1)[1]       # the E_s finding
        assert f"| enc | {task} | {layer} | 0.900 |" in md                      # same numbers in the table
    assert "- In enc-ft, pos peaks at layer 3 (accuracy 0.920" in sentence     # finetuned copy: +0.02
    for line in sentence.splitlines():                                           # the HTML has the same words
        assert f"<li>{escape(line[2:])}</li>" in html
    # the key findings at the top repeat each section's first findings
    keys = md.split("## Key findings\n\n", 1)[1].split("\n\n", 1)[0]
    assert "- In enc, pos peaks at layer 3 (accuracy 0.900" in keys and keys.endswith("(Frozen vs finetuned)")


def test_heads_and_pruning_sentences_match_hand_computed_values(full):
    run, html, md = full
    heads = _finding(md, "Attention heads")
    assert "most clearly for obj (dependent->head): layer 4 head 1 scores 0.950 [0.910, 0.980]" in heads
    assert "against 0.400 for offset -1" in heads
    # Fixture curves: value = 0.9 - slope * f^2. Michel (slope 0.2) drops 0.9 % at f = 0.2 and 2 % at 0.3,
    # 3.6 % at 0.4 and 5.6 % at 0.5; random (slope 0.6) drops 0.7 % at 0.1, 2.7 % at 0.2, 6 % at 0.3.
    prune = _finding(md, "Head importance and pruning")
    assert "in michel order removes 20% within 1% and 40% within 5%" in prune
    assert "against 10% within 1% and 20% within 5% in random order" in prune
    assert "| enc | michel | accuracy | 20% (14 heads) | 40% (29 heads) |" in md   # of 12 x 6 = 72 heads
    assert "0.70x the parameters" in prune and "1.40x the tokens per second" in prune


def test_compare_sentence_names_the_least_similar_layer(full):
    run, html, md = full
    cka = results.load_table(run, "cka")
    diag = cka[cka["layer_a"] == cka["layer_b"]].set_index("layer_a")["value"]
    sentence = _finding(md, "Frozen vs finetuned")
    assert f"lowest at layer {int(diag.idxmin())} ({diag.min():.3f})" in sentence
    assert "pos (enc, accuracy 0.900 finetuned vs 0.700 for frozen)" in sentence
    change = results.load_table(run, "head_change")
    top = change.loc[change["value"].idxmax()]
    assert f"layer {int(top['layer'])} head {int(top['head'])} changed most" in sentence


def test_a_partial_run_still_writes_a_report_naming_the_missing_commands(tmp_path):
    run = make_results_fixture(tmp_path, n_layers=4, n_heads=2, checkpoints=False)
    for p in (run / "tables").glob("*.parquet"):
        if not p.stem.startswith("probing") and p.stem != "mix_weights":
            p.unlink()
    html_path, md_path = report.write_report(run)
    md, html = md_path.read_text(), html_path.read_text()
    for t in TITLES:
        assert f"## {t}" in md
    for command in ("workbench heads MODEL", "workbench prune MODEL", "workbench compare A B", "workbench pretrain"):
        assert command in md and command in html
    assert "No heads_classes, relations tables yet: run `workbench heads MODEL`." in md
    assert "pos peaks at layer 1" in _finding(md, "Per-layer probing")          # 3 * 4 / 12 on a 4-layer model
    assert "workbench probe" not in md


def test_writes_are_atomic_and_replace_the_old_report(tmp_path):
    run = make_results_fixture(tmp_path, n_layers=2, n_heads=2, checkpoints=False)
    (run / "report").mkdir()
    (run / "report" / "summary.md").write_text("old")
    html_path, md_path = report.write_report(run)
    assert sorted(p.name for p in (run / "report").iterdir()) == ["report.html", "summary.md"]   # no temp files
    assert md_path.read_text().startswith("# Report: demo")
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        report.write_report(tmp_path / "nope")


def test_training_table_and_model_cards_from_pretraining_folders(tmp_path):
    from safetensors.numpy import save_file

    run = tmp_path / "r"
    m = run / "models" / "tiny"
    m.mkdir(parents=True)
    lines = [{"step": s, "tokens": 64 * s, "split": sp, "metric": "loss", "value": v, "time": 0.0}
             for s, sp, v in ((1, "train", 9.0), (2, "train", 7.5), (2, "dev", 8.25))]
    (m / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"step": 3, "tok')  # killed mid-line
    (m / "config.json").write_text(json.dumps({"kind": "encoder", "config": {"n_layers": 2, "n_heads": 4, "d_model": 8}}))
    (m / "card.json").write_text(json.dumps({"steps": 2, "tokens": 128, "metrics": {"dev_loss": 8.25},
                                             "data": {"train": ["gutenberg_pd", "train"], "train_tokens": 9}}))
    save_file({"a": np.zeros((3, 4), np.float32), "b": np.zeros(5, np.float32)}, str(m / "model.safetensors"))
    with pytest.warns(UserWarning, match=r"metrics.jsonl: dropped its torn last line \(16 bytes"):
        df = report.training_table(run)
    assert list(df.columns) == results.TRAINING_COLUMNS and len(df) == 3
    assert df[df["split"] == "train"]["value"].tolist() == [9.0, 7.5]
    cards = report.model_table(run).iloc[0]
    assert cards["params"] == 17 and cards["layers"] == 2 and cards["dev_loss"] == 8.25   # a column per metric
    assert cards["data"] == "gutenberg_pd:train"
    with pytest.warns(UserWarning):
        s = report.models_section(run)
    assert s.sentence == ("The train loss of tiny went from 9.000 (step 1) to 7.500 (step 2); "
                          "the last dev loss of tiny is 8.250.")
    assert not s.missing and len(s.figs) == 1


def test_markdown_table_escapes_pipes():
    out = report.markdown_table(pd.DataFrame({"a": ["x|y"], "b": [1]}))
    assert out.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 1 |"]


def test_probing_clause_says_when_no_single_best_layer_was_chosen():
    row = pd.Series({"task": "pos", "best_layer": np.nan, "best": 0.8, "best_low": 0.7, "best_high": 0.9})
    clause = report._task_clause(row, "accuracy")
    assert clause == "pos has no single best layer (accuracy 0.800 [0.700, 0.900]; the halves of its test items disagree)"
    assert report._task_clause(row.replace(np.nan, 2), "accuracy").startswith("pos peaks at layer 2 (")


# report.SECTIONS before the report followed the analysis records (commit 729760d), as section keys
PRE_REGISTRY = ("run", "models", "probing", "objectives", "structural", "pairs", "heads", "pruning", "compare",
                "emergence", "amnesic", "gating", "flow", "interventions")


def test_the_sections_are_the_run_s_then_each_analysis_record_s_in_record_order():
    keys = report.section_keys()
    named = [k for a in ANALYSES.values() for k in a.sections or (report.DEFAULT + a.name,)]
    assert keys == report.RUN_SECTIONS + tuple(named)
    # every section of the hand-written list, none twice, and the default one of the record without sections
    assert sorted(keys) == sorted(PRE_REGISTRY + ("default:cross_heads",))
    assert keys.index("structural") == keys.index("probing") + 2 and keys.index("gating") < keys.index("amnesic")


def test_a_planted_records_section_is_built_at_its_records_place(tmp_path, monkeypatch):
    def planted(run_dir):
        return report.Section("Planted", findings=[f"planted in {run_dir.name}"])

    record = dataclasses.replace(ANALYSES["probe"], name="planted", sections=("planted",))
    monkeypatch.setitem(ANALYSES, "planted", record)
    monkeypatch.setitem(report.SECTION_BUILDERS, "planted", planted)
    assert report.section_keys()[-1] == "planted"
    run = make_results_fixture(tmp_path, n_layers=2, n_heads=2, checkpoints=False)
    sections = report.build_sections(run)
    assert [s.title for s in sections][-1] == "Planted" and sections[-1].findings == [f"planted in {run.name}"]


@pytest.mark.parametrize("sections, message", [
    (("nowhere",), r"unknown \['nowhere'\]"),
    (("heads",), r"named twice \['heads'\]"),
])
def test_a_record_naming_an_unknown_or_taken_section_is_refused(monkeypatch, sections, message):
    monkeypatch.setitem(ANALYSES, "planted", dataclasses.replace(ANALYSES["probe"], name="planted", sections=sections))
    with pytest.raises(ValueError, match=message):
        report.section_keys()


def test_a_section_no_record_names_is_refused(monkeypatch):
    monkeypatch.setitem(report.SECTION_BUILDERS, "orphan", report.run_section)
    with pytest.raises(ValueError, match=r"named by no analysis record \['orphan'\]"):
        report.section_keys()


def test_layer_indices_of_the_probing_summary_print_as_integers():
    """The best layer and the random-init floor's best layer are layer numbers (4, not 4.000)."""
    assert [report._cell(c, 4.0) for c in ("best_layer", "random_init_layer")] == ["4", "4"]
    assert report._cell("random_init", 0.4) == "0.400"
