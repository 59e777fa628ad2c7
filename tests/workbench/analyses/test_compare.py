"""workbench.analyses.compare: a model compared with itself has CKA 1 on the diagonal and JS 0 per head; a
copy whose top block is perturbed changes only at the top (planted); different tokenizers are an
error; probing change puts B next to A per task and layer."""
import copy

import numpy as np
import pytest
import torch
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from plmodels.training.data import with_sentinels
from workbench.analyses.compare import (
    CompareRunConfig,
    check_same_tokenizer,
    compare_loaded,
    compare_models,
    only_adds_specials,
)
from workbench.data.tasks import ud_sentences

L, H = 3, 2
CFG = CompareRunConfig(max_sentences=40, cka_kinds=("linear", "linear_mb", "rbf"), minibatch_size=150,
                       rbf_max_words=300, attn_max_sentences=30, probing_tasks=())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:300]]
    tok = Tokenizer.train_wordpiece(texts, 300)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "n_layers": L, "n_heads": H, "d_model": 32, "d_ff": 64,
              "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    model = build_model("encoder", fields).eval()
    sents = [list(s.words) for s in ud_sentences("ewt", "dev")[:40]]
    return model, tok, sents, tmp_path_factory.mktemp("cmp")


def test_self_comparison_is_identity(tiny):
    model, tok, sents, tmp = tiny
    t = compare_loaded(model, copy.deepcopy(model), tok, sents, ("a", "b"), CFG, tmp / "store")
    cka = t["cka"]
    assert set(cka.kind) == {"linear", "linear_mb", "rbf"}
    for kind, g in cka.groupby("kind"):
        assert len(g) == (L + 1) ** 2
        diag = g[g.layer_a == g.layer_b].value
        np.testing.assert_allclose(diag, 1.0, atol=2e-3, err_msg=kind)
    js = t["head_change"]
    assert list(js.columns) == ["model_a", "model_b", "layer", "head", "metric", "value"]
    assert len(js) == L * H and set(js.metric) == {"js"}
    np.testing.assert_allclose(js.value, 0.0, atol=1e-6)


def test_perturbed_top_layer_changes_only_the_top(tiny):
    model, tok, sents, tmp = tiny
    other = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.blocks[L - 1].parameters():
            p.add_(torch.randn_like(p) * 0.5)
    t = compare_loaded(model, other, tok, sents, ("a", "b"), CFG, tmp / "store")
    lin = t["cka"][t["cka"].kind == "linear"]
    diag = lin[lin.layer_a == lin.layer_b].set_index("layer_a").value
    np.testing.assert_allclose(diag.loc[:L - 1], 1.0, atol=2e-3)   # embeddings and blocks 0..L-2 untouched
    assert diag.loc[L] < 0.95                                      # hidden_states[L] = output of the top block
    js = t["head_change"].set_index(["layer", "head"]).value
    np.testing.assert_allclose(js.loc[: L - 2], 0.0, atol=1e-6)
    assert (js.loc[L - 1] > 1e-3).all()


def test_different_tokenizers_are_an_error(tiny):
    model, tok, sents, tmp = tiny
    plmodels.save(model, tok, tmp / "a")
    tok2 = Tokenizer.train_wordpiece([" ".join(s) for s in sents], 200)
    fields = {**model.config.to_dict(), "vocab_size": tok2.vocab_size}
    fields.pop("pruned_heads", None)
    plmodels.save(build_model("encoder", fields), tok2, tmp / "b")
    with pytest.raises(ValueError, match="different tokenizers"):
        compare_models(tmp / "a", tmp / "b", out_dir=tmp / "out_err", config=CFG, progress=False)


def test_a_tokenizer_that_only_adds_specials_splits_text_the_same(tiny):
    """T5's run adds its sentinels to the tokenizer it shares with the other systems: comparable."""
    _, tok, sents, _ = tiny
    t5 = with_sentinels(tok, 4)
    assert only_adds_specials(tok, t5) and not only_adds_specials(t5, tok)
    assert all(tok.encode(" ".join(s)) == t5.encode(" ".join(s)) for s in sents)
    check_same_tokenizer(tok, t5, "a", "t5")
    plain = Tokenizer(HFTokenizer.from_str(tok.hf.to_str()), tok.kind, tok.specials, lowercase=tok.lowercase)
    plain.hf.add_tokens([AddedToken("newword", special=False)])  # a new word changes how text splits
    assert not only_adds_specials(tok, plain)
    other = Tokenizer.train_wordpiece([" ".join(s) for s in sents], 200)
    with pytest.raises(ValueError, match="different tokenizers"):
        check_same_tokenizer(tok, other, "a", "b")


def test_compare_models_with_probing_change(tiny):
    model, tok, _, tmp = tiny
    plmodels.save(model, tok, tmp / "base")
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.blocks[L - 1].parameters():
            p.add_(torch.randn_like(p) * 0.5)
    plmodels.save(other, tok, tmp / "changed")
    cfg = CompareRunConfig.from_dict({**CFG.to_dict(), "cka_kinds": ["linear"], "probing_tasks": ["pos"],
                                      "probe_overrides": {"modes": ["single"], "seeds": [0], "max_epochs": 2,
                                                          "max_train_targets": 200, "max_eval_targets": 100,
                                                          "n_boot": 0, "probes": ["linear"], "layers": [0, L]}})
    t = compare_models(tmp / "base", tmp / "changed", out_dir=tmp / "out", config=cfg, names=("base", "changed"),
                       progress=False)
    assert {"cka", "head_change", "probing_change"} <= set(t)
    pc = t["probing_change"]
    assert list(pc.columns) == ["model_a", "model_b", "task", "layer", "metric", "value_a", "value_b", "delta"]
    assert set(pc.layer) == {0, L} and set(pc.task) == {"pos"}
    emb = pc[pc.layer == 0]
    np.testing.assert_allclose(emb.delta, 0.0, atol=1e-9)  # embeddings are the same: same probe score
    np.testing.assert_allclose(pc.delta, pc.value_b - pc.value_a)
    assert (tmp / "out" / "tables" / "cka.parquet").exists()


def test_unknown_config_key_is_an_error():
    with pytest.raises(ValueError, match="unknown key 'cka_kind'"):
        CompareRunConfig.from_dict({"cka_kind": ["linear"]})
    with pytest.raises(ValueError, match="cka_kinds"):
        CompareRunConfig.from_dict({"cka_kinds": ["cosine"]})
