"""Every page under Streamlit's AppTest on the results fixture: no exception, the expected figures,
and, without results, a notice naming the CLI command that produces them."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.apps.browser import PAGES

APP = str(Path(__file__).resolve().parents[2] / "apps" / "app.py")


def _app(monkeypatch, root) -> AppTest:
    monkeypatch.setenv("WORKBENCH_RESULTS", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    return at


def _goto(at: AppTest, path: str) -> AppTest:
    at.switch_page(f"app_pages/{path}.py")
    at.run()
    return at


def test_every_page_renders_its_figures(monkeypatch, results_root):
    at = _app(monkeypatch, results_root)
    assert at.sidebar.selectbox(key="run").value == "demo"
    for path, title, n_plots in PAGES:
        _goto(at, path)
        assert not at.exception, f"{path}: {[e.value for e in at.exception]}"
        assert at.title[0].value == title
        assert len(at.get("plotly_chart")) == n_plots, path
        assert not at.error, f"{path}: {[e.value for e in at.error]}"


def test_heads_page_colours_by_score_and_types_a_sentence(monkeypatch, results_root):
    at = _goto(_app(monkeypatch, results_root), "heads")
    at.selectbox(key="heads_color").select("prev_token").run()
    assert not at.exception and '"prev_token"' in at.get("plotly_chart")[0].proto.spec
    at.radio(key="heads_source").set_value("typed sentence").run()
    at.selectbox(key="heads_ckpt").select("tiny-dec").run()
    at.text_input(key="heads_text").input("Dogs bark loudly at night .").run()
    assert not at.exception and not at.error
    assert "Dogs" in at.get("plotly_chart")[-2].proto.spec           # the heatmap's word ticks


def test_playground_encoder_and_decoder(monkeypatch, results_root):
    at = _goto(_app(monkeypatch, results_root), "playground")
    at.selectbox(key="play_model").select("tiny-enc (encoder)").run()
    assert not at.exception and "Masked-token predictions" in at.get("plotly_chart")[0].proto.spec
    at.text_input(key="play_text_encoder").input("no mask at all").run()
    assert any("[MASK]" in w.value for w in at.warning)
    at.selectbox(key="play_model").select("tiny-dec (decoder)").run()
    assert not at.exception and any("Continuation" in m.value for m in at.markdown)


@pytest.mark.parametrize("path,command", [
    ("layers", "workbench probe MODEL"), ("heads", "workbench heads MODEL"),
    ("pruning", "workbench prune MODEL"), ("compare", "workbench compare A B"),
    ("playground", "workbench run configs/demo.json"), ("runs", "workbench run configs/demo.json"),
    ("pairs", "workbench pairs MODEL"),
])
def test_pages_name_the_command_when_results_are_missing(monkeypatch, partial_root, path, command):
    at = _goto(_app(monkeypatch, partial_root), path)
    assert not at.exception
    assert any(command in i.value for i in at.info), [i.value for i in at.info]


def test_empty_results_root(monkeypatch, tmp_path):
    at = _goto(_app(monkeypatch, tmp_path / "nothing"), "layers")
    assert not at.exception
    assert any("workbench run configs/demo.json" in i.value for i in at.info)


@pytest.mark.slow
def test_every_selector_option_on_the_tiny_pipeline_output(monkeypatch, tiny_run):
    """What the main job really writes, every page, every option of every select box and radio once
    (the others left at their defaults): no exception, no error block."""
    at = _app(monkeypatch, tiny_run.parent)
    tried = 0
    for path, _, _ in PAGES:
        _goto(at, path)
        assert not at.exception, f"{path}: {[e.value for e in at.exception]}"
        widgets = [("selectbox", w.key, len(w.options)) for w in at.selectbox if w.key and w.key != "run"]
        widgets += [("radio", w.key, len(w.options)) for w in at.radio if w.key]
        for kind, key, n in widgets:
            # a long list (the stored sentences) is sampled: its first, middle and last option
            for i in (range(n) if n <= 12 else sorted({0, n // 2, n - 1})):
                try:
                    w = getattr(at, kind)(key=key)
                except KeyError:          # an earlier choice hid it (e.g. a model without that score)
                    break
                if i >= len(w.options):   # or narrowed its options
                    break
                (w.select_index(i) if kind == "selectbox" else w.set_value(w.options[i])).run()
                tried += 1
                assert not at.exception, f"{path} {key}=#{i}: {[e.value for e in at.exception]}"
                assert not at.error, f"{path} {key}=#{i}: {[e.value for e in at.error]}"
    assert tried >= 10, tried
    # the behaviour page draws what the tiny run's pairs step wrote: each figure per model, floors beside
    _goto(at, "pairs")
    for model in ("decoder", "encoder"):
        at.selectbox(key="pairs_model").select(model).run()
        specs = [c.proto.spec for c in at.get("plotly_chart")]
        assert len(specs) == 2 and "floor: bigram" in specs[0] and "attractors" in specs[1], model
