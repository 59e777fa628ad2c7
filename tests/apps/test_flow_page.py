"""The Flow page under Streamlit's AppTest, on the tables `workbench.analyses.flow.flow_model` really
writes (a tiny decoder of the results fixture): the run's three figures with their floors, then a typed
sentence's lens top tokens per layer (logit and the saved tuned lens) and every method's attributions;
on a run without flow tables the page names the command and still reads a typed sentence; a model with
the token-identity curves only (a tiny ELECTRA discriminator) shows them and says why the lens is
absent, and a tiny T5 shows each stack's curves and its decoder stack's lens."""

from __future__ import annotations

import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from tests.apps.fixtures import app_page, make_results_fixture
from workbench.analyses.flow import ATTRIBUTION_METHODS, flow_model
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences

CFG = dict(n_sentences=16, attr_sentences=3, lens_train_sentences=16, n_tokens=8, n_clusters=8, n_boot=10,
           tuned_steps=3, random_draws=2, max_tokens=20)


@pytest.fixture(scope="module")
def flow_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("flow_results")
    run = make_results_fixture(root, n_layers=2, n_heads=2)
    flow_model(run / "models" / "tiny-dec", out_dir=run, config=CFG, model_name="tiny-dec")
    return root


@pytest.mark.slow
@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_the_page_draws_the_run_and_a_typed_sentence(monkeypatch, flow_root):
    at = app_page(monkeypatch, flow_root, "app_pages/flow.py")
    at.selectbox(key="flow_model").select("tiny-dec (decoder)").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Flow" and not at.info and not at.error
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert len(specs) == 4
    assert "random init (floor)" in specs[0] and "shuffled tokens (floor)" in specs[0]
    assert "random init, logit lens (floor)" in specs[1] and "faithfulness" in specs[2]
    assert all(m in specs[3] for m in ATTRIBUTION_METHODS)
    # the lens tables: logit and the tuned lens flow_model saved beside the checkpoint; the scores' table
    assert len(at.dataframe) == 3 and any("tuned lens" in m.value for m in at.markdown)
    before = at.get("plotly_chart")[3].proto.spec
    at.text_input(key="flow_text").input("Dogs bark loudly at night .").run()
    assert not at.exception and at.get("plotly_chart")[3].proto.spec != before  # the typed text is what is read
    at.text_input(key="flow_text").input("").run()
    assert not at.exception and any("two word pieces" in w.value for w in at.warning)


def test_without_flow_tables_the_page_names_the_command(monkeypatch, results_root):
    at = app_page(monkeypatch, results_root, "app_pages/flow.py")
    assert not at.exception, [e.value for e in at.exception]
    assert any("workbench flow MODEL" in i.value for i in at.info), [i.value for i in at.info]
    assert len(at.get("plotly_chart")) == 1  # the typed sentence is read all the same


@pytest.fixture(scope="module")
def mi_only_root(tmp_path_factory):
    """A run whose flow tables `flow_model` wrote for a tiny ELECTRA discriminator (an encoder whose card
    says its LM head is untrained: the MI curves only) and a tiny T5 (its encoder's curves, its
    teacher-forced decoder's curves and lens)."""
    root = tmp_path_factory.mktemp("flow_mi_only")
    run = make_results_fixture(root, n_layers=2, n_heads=2, checkpoints=False)
    tok = Tokenizer.train_wordpiece([" ".join(s.words) for s in ud_sentences("ewt", "train")[:300]], 250)
    torch.set_num_threads(1)
    for name, kind, card in (("tiny-disc", "encoder", {"objective_name": "electra"}), ("tiny-s2s", "seq2seq", None)):
        torch.manual_seed(0)
        model = build_model(kind, {**preset(kind, "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0})
        plmodels.save(model, tok, run / "models" / name, card=card)
        flow_model(run / "models" / name, out_dir=run, config={**CFG, "estimators": ["kmeans"]}, model_name=name)
    return root


@pytest.mark.slow
@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_an_mi_only_model_shows_its_curves_and_says_why_the_lens_is_absent(monkeypatch, mi_only_root):
    at = app_page(monkeypatch, mi_only_root, "app_pages/flow.py")
    at.selectbox(key="flow_model").select("tiny-disc (encoder)").run()
    assert not at.exception, [e.value for e in at.exception]
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert len(specs) == 1  # the curves; no empty lens or attribution figure
    assert "random init (floor)" in specs[0] and "shuffled tokens (floor)" in specs[0]
    assert "the input token" in specs[0] and "the token to predict" in specs[0]
    assert len(at.info) == 1 and "curves only; no sentence view" in at.info[0].value
    assert "LM head is untrained" in at.info[0].value
    assert not len(at.text_input)  # no sentence to type: its head would read nothing the model learnt
    at.selectbox(key="flow_model").select("tiny-s2s (seq2seq)").run()
    assert not at.exception, [e.value for e in at.exception]
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert len(specs) == 3 and "tiny-s2s: token identity" in specs[0]
    assert "tiny-s2s;decoder: token identity" in specs[1] and "tiny-s2s;decoder: what each layer" in specs[2]
    assert "random init, logit lens (floor)" in specs[2]
    assert len(at.info) == 1 and "the lens of tiny-s2s;decoder" in at.info[0].value
    assert "own stack has no LM readout" in at.info[0].value and not len(at.text_input)
