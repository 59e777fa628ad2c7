"""The flow suite on every family the workbench trains (workbench.analyses.flow, `Family.flow_stacks`):
the token-identity MI curves of each stack (an encoder-decoder's encoder and its decoder teacher-forced),
the layer that copies the token recovering all of H(Y), and the lens only on a stack whose LM head reads
its every layer (an encoder-decoder's decoder, teacher-forced), the LM attribution only where the model
itself has one and a view of its prediction."""
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import FAMILIES, preset
from plmodels.tokenizer import Tokenizer
from workbench.analyses.flow import FlowRunConfig, _sentences, flow_kinds, flow_model
from workbench.core.paths import data_root
from workbench.data.tasks import ud_sentences
from workbench.presentation.analysis_figures import flow_figures

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")]

CFG = dict(n_sentences=30, attr_sentences=2, lens_train_sentences=20, n_tokens=10, n_clusters=10, n_boot=10,
           tuned_steps=2, random_draws=2, max_tokens=20, estimators=["kmeans"])
# kind -> (the stacks' name suffixes, the config fields that leave layer 0 the token embedding alone)
CASES = {"seq2seq": (("", ";decoder"), {"position": "relative"}), "xlnet": (("", ";query"), {}),
         "bilm": (("", ";forward", ";backward"), {}), "tbilm": (("", ";forward", ";backward"), {"position": "rope"})}
# kind -> the stacks read through the lens; the stacks with a token-to-predict MI curve
LENSED = {"seq2seq": {"m;decoder"}, "xlnet": {"m;query"}, "bilm": {"m;forward", "m;backward"},
          "tbilm": {"m;forward", "m;backward"}}
PREDICTED = {"xlnet": {"m;query"}, "bilm": {"m;forward", "m;backward"}, "tbilm": {"m;forward", "m;backward"}}


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
    n_layers = {"m": model.config.n_layers, "m;decoder": getattr(model.config, "n_decoder_layers", None),
                **{f"m;{s}": model.config.n_layers for s in ("forward", "backward", "query")}}
    for name, g in mi.groupby("model"):
        # the input token only, unless the stack predicts a token of its own (a biLM's directions)
        assert set(g.label) == ({"input", "predict"} if name in PREDICTED.get(kind, ()) else {"input"}), name
        assert g.layer.max() == n_layers[name] and set(g.variant) == {"trained", "random_init"}
        frac = g[(g.metric == "mi_fraction") & (g.layer == 0) & (g.label == "input")].set_index(
            ["variant", "control"]).value
        # layer 0 is the token's embedding: 10 clusters separate the 10 tokens; the shuffled control does not.
        # XLNet's query stream starts from one vector everywhere (mask_emb): it knows no token there
        if name == "m;query":
            assert frac[("trained", "none")] == pytest.approx(0.0, abs=1e-6), (name, frac)
            continue
        assert frac[("trained", "none")] == pytest.approx(1.0, abs=1e-6), (name, frac)
        assert frac[("trained", "shuffled")] < 0.6
    assert kind not in flow_kinds()
    lensed = LENSED.get(kind, set())  # the decoder stack, a biLM's directions: read through the LM head
    assert set(t["flow_lens"].model) == lensed and t["flow_attribution"].empty
    assert (tmp_path / "lens").exists() == bool(lensed)


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


def test_a_seq2seqs_decoder_is_read_through_the_lens_teacher_forced(tok, tmp_path):
    """The decoder stack's lens rows: at its last layer both lenses are the model's own distribution (KL
    0, agreement 1), lower layers are not; the tuned lens is saved in the lens folder's decoder/; the
    figures are each stack's MI curves and the decoder's lens, no empty attribution figure
    (analysis_figures.flow_figures); the decoder has no "predict" MI curve (its next token is a copy)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("seq2seq", {**preset("seq2seq", "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0})
    plmodels.save(model, tok, tmp_path / "m")
    t = flow_model(tmp_path / "m", config=CFG, model_name="m", lens_dir=tmp_path / "lens")
    lens = t["flow_lens"]
    last = lens[lens.layer == model.config.n_decoder_layers]
    assert set(last.model) == {"m;decoder"} and set(last.lens) == {"logit", "tuned"}
    for variant, g in last.groupby("variant"):
        kl, agree = g[g.metric == "kl"].value, g[g.metric == "top1_agree"].value
        assert kl.abs().max() < 1e-5 and (agree == 1.0).all(), variant
    lower = lens[(lens.layer == 0) & (lens.variant == "trained") & (lens.metric == "kl")]
    assert (lower.value > 1e-3).all()
    assert (tmp_path / "lens" / "decoder" / "tuned_lens.safetensors").is_file()
    assert set(t["flow_mi"][t["flow_mi"].model == "m;decoder"].label) == {"input"}
    assert sorted(flow_figures(t)) == ["flow_lens_m;decoder", "flow_mi_m", "flow_mi_m;decoder"]


@pytest.mark.parametrize("kind", ["bilm", "tbilm"])
def test_each_biLM_direction_is_read_with_its_own_target(kind, tok, tmp_path):
    """The forward LM's items are labelled with the next token, the backward LM's with the previous one:
    the lens' LM loss at each direction's last layer equals the biLM's own next-token (forward logits)
    and previous-token (backward logits) NLL on the same test sentences, recomputed here sentence by
    sentence; the two differ, so swapping the targets (or the halves) fails."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(kind, {**preset(kind, "tiny"), "vocab_size": tok.vocab_size, "dropout": 0.0,
                               **CASES[kind][1]}).eval()
    plmodels.save(model, tok, tmp_path / "m")
    t = flow_model(tmp_path / "m", config=CFG, model_name="m", lens_dir=tmp_path / "lens")
    cfg = FlowRunConfig.resolve(CFG)
    special = set(tok.special_ids)
    nll = {"m;forward": [], "m;backward": []}
    with torch.no_grad():
        for s in _sentences(cfg, tok, "test", cfg.n_sentences):
            out = model(torch.tensor([s]), return_logits=True)
            fwd, bwd = torch.log_softmax(out.logits[0], -1), torch.log_softmax(out.backward_logits[0], -1)
            nll["m;forward"] += [-float(fwd[i, s[i + 1]]) for i in range(len(s) - 1) if s[i + 1] not in special]
            nll["m;backward"] += [-float(bwd[i, s[i - 1]]) for i in range(1, len(s)) if s[i - 1] not in special]
    lens = t["flow_lens"]
    top = lens[(lens.layer == model.config.n_layers) & (lens.metric == "lm_loss") & (lens.variant == "trained")
               & (lens.lens == "logit")].set_index("model").value
    for name, values in nll.items():
        assert top[name] == pytest.approx(sum(values) / len(values), rel=1e-4), name
    assert abs(top["m;forward"] - top["m;backward"]) > 1e-3
    assert (tmp_path / "lens" / "forward" / "tuned_lens.json").is_file()
    assert (tmp_path / "lens" / "backward" / "tuned_lens.json").is_file()
