"""workbench.analyses.flow on a tiny decoder checkpoint: the tables' shape, and the properties the
pipeline must keep (the lens at the last layer is the model, layer 0 is a copy of the token, IG's
completeness, the tuned lens saved as safetensors)."""
import numpy as np
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from probes.lens import TunedLens, lm_readout
from workbench.analyses.flow import (ATTR_COLUMNS, ATTRIBUTION_METHODS, LENS_COLUMNS, MI_COLUMNS, FlowRunConfig,
                                     flow_model, flow_sentence)
from workbench.analyses.registry import ANALYSES
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences
from workbench.presentation.analysis_figures import flow_figures
from workbench.presentation.report import flow_section

pytestmark = pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")

CFG = dict(n_sentences=40, attr_sentences=4, lens_train_sentences=40, n_tokens=12, n_clusters=12, n_boot=20,
           tuned_steps=5, random_draws=2, max_tokens=24)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:400]]
    tok = Tokenizer.train_bpe(texts, 400)
    torch.manual_seed(0)
    fields = {**preset("decoder", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0, "position": "rope"}
    path = tmp_path_factory.mktemp("dec") / "tiny"
    plmodels.save(build_model("decoder", fields), tok, path)
    return path


@pytest.fixture(scope="module")
def tables(decoder, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("flow")
    return flow_model(decoder, out_dir=out / "run", config=CFG, lens_dir=out / "lens"), out


def test_columns_and_written_tables(tables):
    t, out = tables
    assert list(t["flow_mi"].columns) == MI_COLUMNS and list(t["flow_lens"].columns) == LENS_COLUMNS
    assert list(t["flow_attribution"].columns) == ATTR_COLUMNS
    assert {p.name for p in (out / "run" / "tables").iterdir()} >= {"flow_mi.parquet", "flow_lens.parquet",
                                                                     "flow_attribution.parquet"}
    assert (out / "lens" / "tuned_lens.safetensors").is_file()
    assert set(t["flow_mi"].variant) == {"trained", "random_init"}
    assert set(t["flow_attribution"].method) >= {"rollout", "flow", "value_zeroing", "integrated_gradients", "random"}


def test_lens_at_the_last_layer_is_the_models_own_distribution(tables):
    lens = tables[0]["flow_lens"]
    last = lens[lens.layer == lens.layer.max()].set_index(["variant", "lens", "metric"]).value
    for variant, kind in (("trained", "logit"), ("trained", "tuned"), ("random_init", "logit")):
        assert abs(last[(variant, kind, "kl")]) < 1e-5
        assert last[(variant, kind, "top1_agree")] == 1.0


def test_layer_zero_copies_the_input_token(tables):
    """A decoder with RoPE has the token embedding alone at layer 0: k-means with as many clusters as
    tokens recovers all of H(Y); the shuffled control does not."""
    mi = tables[0]["flow_mi"].set_index(["variant", "estimator", "label", "control", "layer", "metric"]).value
    for variant in ("trained", "random_init"):
        assert mi[(variant, "kmeans", "input", "none", 0, "mi_fraction")] == pytest.approx(1.0, abs=1e-6)
        assert mi[(variant, "kmeans", "input", "shuffled", 0, "mi_fraction")] < 0.5


def test_integrated_gradients_complete_within_one_percent(tables):
    a = tables[0]["flow_attribution"].set_index(["method", "metric"])
    row = a.loc[("integrated_gradients", "completeness_error")]
    assert row.value < 0.01 and row.n_items == CFG["attr_sentences"]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="FlowRunConfig.estimators"):
        FlowRunConfig(estimators=("kmeans", "gzip"))
    with pytest.raises(ValueError, match="n_tokens"):
        FlowRunConfig.resolve({"n_tokens": 0})


def test_figures_draw_each_curve_beside_its_floor(tables):
    t, _ = tables
    figs = flow_figures(t)
    assert set(figs) == {"flow_mi_tiny", "flow_lens_tiny", "flow_attribution_tiny"}
    names = {tr.name for tr in figs["flow_mi_tiny"].data}
    assert {"kmeans: trained", "kmeans: random init (floor)", "kmeans: shuffled tokens (floor)"} <= names
    mi = t["flow_mi"]
    want = mi[(mi.metric == "mi_bits") & (mi.label == "input") & (mi.estimator == "kmeans") & (mi.variant == "trained")
              & (mi.control == "none")].sort_values("layer").value.to_numpy()
    drawn = next(tr for tr in figs["flow_mi_tiny"].data if tr.name == "kmeans: trained")
    np.testing.assert_allclose(drawn.y, want)  # the first panel is the input token's
    assert "random init, logit lens (floor)" in {tr.name for tr in figs["flow_lens_tiny"].data}
    assert "random" in set(figs["flow_attribution_tiny"].data[0].x)


def test_report_section_reads_the_tables_beside_their_floors(tables):
    _, out = tables
    s = flow_section(out / "run")
    assert not s.missing and len(s.figs) == 3
    mi = s.findings[0]
    assert mi.startswith("tiny: input-token MI (kmeans)") and "random init" in mi and "shuffled-token control" in mi
    assert "clears the random floor" in s.findings[1]
    assert flow_section(out / "nothing").missing == ["flow_mi"]


def test_the_pipeline_knows_the_flow_record():
    rec = ANALYSES["flow"]
    assert rec.config_class is FlowRunConfig and set(rec.tables) == {"flow_mi", "flow_lens", "flow_attribution"}


def test_one_typed_sentence_lens_and_attributions(decoder, tables):
    _, out = tables
    model, tok = plmodels.load(decoder)
    model.eval()
    text = "the man said that he would go home"
    got = flow_sentence(model, tok, text, lens=TunedLens.load(out / "lens", lm_readout(model)), k=3)
    ids = tok.encode(text)
    p = len(ids) - 2  # a decoder: the last token given the rest, read at the position before it
    with torch.no_grad():
        own = model(torch.tensor([ids])).logits[0, p].log_softmax(-1)
    target = got["target"].iloc[0]
    assert target.position == p and target.log_prob == pytest.approx(float(own[ids[-1]]), abs=1e-4)
    lens = got["lens"]
    assert set(lens.lens) == {"logit", "tuned"} and lens.layer.max() == model.config.n_layers
    top = lens[(lens.layer == lens.layer.max()) & (lens["rank"] == 1)]
    assert set(top.token) == {tok.decode([int(own.argmax())])}  # both lenses are the model at the top layer
    attr = got["attributions"]
    assert set(attr.method) == set(ATTRIBUTION_METHODS)
    assert sorted(attr.position.unique()) == [t for t in range(1, p + 1) if ids[t] not in tok.special_ids]
    with pytest.raises(ValueError, match="two word pieces"):
        flow_sentence(model, tok, "", k=3)
