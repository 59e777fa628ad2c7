"""The flow suite on every family the workbench trains (workbench.analyses.flow, `Family.flow_stacks`):
the token-identity MI curves of each stack (an encoder-decoder's encoder and its decoder teacher-forced),
the layer that copies the token recovering all of H(Y), and the lens and LM attribution only where the
family has an LM head that reads every layer and a view of its prediction."""
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import FAMILIES, preset
from plmodels.tokenizer import Tokenizer
from workbench.analyses.flow import flow_kinds, flow_model
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences
from workbench.presentation.analysis_figures import flow_figures

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")]

CFG = dict(n_sentences=30, attr_sentences=2, lens_train_sentences=20, n_tokens=10, n_clusters=10, n_boot=10,
           tuned_steps=2, random_draws=2, max_tokens=20, estimators=["kmeans"])
# kind -> (the stacks' name suffixes, the config fields that leave layer 0 the token embedding alone)
CASES = {"seq2seq": (("", ";decoder"), {"position": "relative"}), "xlnet": (("",), {}), "bilm": (("",), {}),
         "tbilm": (("",), {"position": "rope"})}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train_wordpiece([" ".join(s.words) for s in ud_sentences("ewt", "train")[:400]], 300)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_every_stack_has_its_token_identity_curve(kind, tok, tmp_path):
    torch.set_num_threads(1)
    suffixes, fields = CASES[kind]
    torch.manual_seed(0)
    model = build_model(kind, {**preset(kind, "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0, **fields})
    plmodels.save(model, tok, tmp_path / "m")
    t = flow_model(tmp_path / "m", config=CFG, model_name="m", lens_dir=tmp_path / "lens")
    mi = t["flow_mi"]
    assert set(mi.model) == {"m" + s for s in suffixes}
    n_layers = {"m": model.config.n_layers, "m;decoder": getattr(model.config, "n_decoder_layers", None)}
    for name, g in mi.groupby("model"):
        assert set(g.label) == {"input"}  # no view of this family's prediction: the input token only
        assert g.layer.max() == n_layers[name] and set(g.variant) == {"trained", "random_init"}
        frac = g[(g.metric == "mi_fraction") & (g.layer == 0)].set_index(["variant", "control"]).value
        # layer 0 is the token's embedding: 10 clusters separate the 10 tokens; the shuffled control does not
        assert frac[("trained", "none")] == pytest.approx(1.0, abs=1e-6), (name, frac)
        assert frac[("trained", "shuffled")] < 0.6
    assert kind not in flow_kinds()
    assert t["flow_lens"].empty and t["flow_attribution"].empty and not (tmp_path / "lens").exists()


def test_the_families_with_the_whole_suite():
    assert flow_kinds() == ["decoder", "encoder"]
    assert set(CASES) | set(flow_kinds()) == set(FAMILIES)  # every family is read by one test or the other


def test_electras_discriminator_gets_the_mi_curves_only(tok, tmp_path):
    """Its card says its LM head is never trained (`Card.lm_head_trained`): no lens, no LM attribution;
    an encoder's two MI curves (the input token, the masked token) stay."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("encoder", {**preset("encoder", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0,
                                    "position": "rope"})
    plmodels.save(model, tok, tmp_path / "disc", card={"objective_name": "electra"})
    t = flow_model(tmp_path / "disc", config=CFG, model_name="disc", lens_dir=tmp_path / "lens")
    assert set(t["flow_mi"].label) == {"input", "predict"}
    assert t["flow_lens"].empty and t["flow_attribution"].empty and not (tmp_path / "lens").exists()


def test_a_seq2seq_runs_figures_are_the_mi_curves_of_each_stack(tok, tmp_path):
    """No lens or attribution rows: no empty lens or attribution figure (analysis_figures.flow_figures)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("seq2seq", {**preset("seq2seq", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0})
    plmodels.save(model, tok, tmp_path / "m")
    t = flow_model(tmp_path / "m", config=CFG, model_name="m")
    assert sorted(flow_figures(t)) == ["flow_mi_m", "flow_mi_m;decoder"]
