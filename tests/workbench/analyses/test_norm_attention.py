"""Norm-weighted attention (Kobayashi et al. 2020, "Attention is Not Only a Weight").

- the value-vector norms ||f_h(x_j)|| equal a computation from the weights, and sum_j alpha_ij
  f_h(x_j) over heads plus b_O rebuilds the attention sub-layer output (the definition), with pruned
  heads, a head mask and the unpadded path;
- the store's renormalisation: rows sum to 1, a row without mass takes the raw row, no NaN;
- the store key and index record the weighting; raw keys are the keys of before the option;
- a planted head that attends to a [CLS] whose value vector is zero: a [CLS] sink in raw attention,
  not under norm weighting, through extraction and HeadStats (analyse_loaded);
- the raw tables of a run with both weightings equal those of a run without the option;
- upserting both weightings beside a model written by older code (no `weighting` column), read back
  as raw by the views and the figures;
- the Heads page on tables the pipeline writes with both weightings (AppTest).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

import plmodels
from plmodels.components.norms import head_value_norms, record_value_norms
from plmodels.decoder import Decoder, DecoderConfig
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.tokenizer import Tokenizer
from probes.heads import weighting_rows
from tests.workbench.analyses.ud_heads import MAX_POS, RUN, word_vocab_tokenizer
from workbench.analyses.heads import HeadRunConfig, analyse_loaded, sentence_attention, summarise_heads
from workbench.analyses.prune import find_heads_classes
from workbench.core.results import write_table
from workbench.presentation import analysis_figures, views
from workbench.store import extract, keys
from workbench.store.word_attention import renormalised_word_maps, word_maps

APP = str(Path(__file__).resolve().parents[3] / "apps" / "app.py")
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "unbelievable things happen today",
         "the cat and the dog are friends"] * 3


# ------------------------------------------------------------------------------ the definition
def _model(kind: str, bias: bool = True):
    torch.manual_seed(0)
    if kind == "encoder":
        m = Encoder(EncoderConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_positions=16,
                                  dropout=0.0, bias=bias))
    else:
        m = Decoder(DecoderConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_positions=16,
                                  dropout=0.0, bias=bias))
    m.prune_heads({1: [0, 2], 2: [0, 1, 2, 3]})  # layer 1: heads 1, 3 left; layer 2: no head
    return m.eval()


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_value_norms_from_the_weights_rebuild_the_attention_output(kind):
    model = _model(kind)
    ids = torch.randint(5, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:], mask[2, 3:] = 0, 0
    head_mask = torch.ones(3, 4)
    head_mask[0, 1] = 0.0  # a gated head: its probabilities (returned after the mask) are 0
    inputs = {}  # the attention sub-layer's input x per layer, for an independent v = x W_V + b_V
    handles = [b.attn.register_forward_pre_hook(lambda mod, args, l=l: inputs.__setitem__(l, args[0]))
               for l, b in enumerate(model.blocks)]
    kw = {"return_logits": False} if kind == "decoder" else {}
    try:
        with torch.no_grad(), record_value_norms(model) as norms:
            out, cache = model.run_with_cache(ids, names=[f"blocks.{l}.attn_out" for l in range(3)],
                                              attention_mask=mask, head_mask=head_mask, output_attentions=True, **kw)
    finally:
        for h in handles:
            h.remove()
    assert norms[2] is None and out.attentions[2].shape[1] == 0  # every head pruned: nothing recorded
    for l in range(2):
        attn = model.blocks[l].attn
        H, Dh, D = attn.n_heads, attn.head_dim, attn.d_model
        Wv = attn.qkv.weight[2 * H * Dh:]  # (H Dh, D): the value rows of the fused projection
        bv = attn.qkv.bias[2 * H * Dh:]
        v = (inputs[l] @ Wv.T + bv).view(3, 9, H, Dh)  # (B, T, H, Dh)
        f = torch.stack([v[:, :, h] @ attn.out.weight[:, h * Dh:(h + 1) * Dh].T for h in range(H)], 1)  # (B, H, T, D)
        torch.testing.assert_close(norms[l], torch.linalg.vector_norm(f, dim=-1))
        rebuilt = torch.einsum("bhij,bhjd->bid", out.attentions[l], f) + attn.out.bias  # (B, T, D)
        torch.testing.assert_close(rebuilt, cache[f"blocks.{l}.attn_out"], atol=1e-5, rtol=0)
        assert norms[l].shape == (3, H, 9) and attn.head_ids == ([0, 1, 2, 3] if l == 0 else [1, 3])
    # the unpadded path (what extraction runs): the v site still sees (B, T, H, Dh), same norms at the
    # real tokens, 0 at the padding (its value rows are zeros there, not the bias)
    with torch.no_grad(), record_value_norms(model) as packed:
        model(ids, attention_mask=mask, head_mask=head_mask, output_attentions=True, unpad=True, **kw)
    for l in range(2):
        real = mask.bool()[:, None, :].expand_as(norms[l])
        torch.testing.assert_close(packed[l][real], norms[l][real])
        assert (packed[l][~real] == 0).all()


def test_head_value_norms_refuses_mismatched_heads():
    model = _model("encoder")
    with pytest.raises(ValueError, match="heads"):
        head_value_norms(torch.zeros(1, 2, 4, 8), model.blocks[1].attn)  # layer 1 has 2 heads left


# ------------------------------------------------------------------------------ the store
def test_renormalised_rows_sum_to_one_and_an_empty_row_takes_the_raw_row():
    tok_word = torch.tensor([[-1, 0, 0, 1, -1]])  # [CLS] w0 w0 w1 [SEP]
    slot = torch.tensor([[0, -1, -1, -1, 1]])
    raw = torch.softmax(torch.randn(1, 2, 5, 5), -1)
    norms = torch.rand(1, 2, 5) + 0.1
    norms[0, 1] = 0.0  # head 1: every vector zero, so every row has no mass
    maps = word_maps(tok_word, slot, 2, 2)
    word, special = renormalised_word_maps(raw * norms[:, :, None, :], raw, maps)
    assert torch.isfinite(word).all() and torch.isfinite(special).all()
    torch.testing.assert_close(word.sum(-1) + special.sum(-1), torch.ones(1, 2, 2))
    raw_word, raw_special = renormalised_word_maps(raw, raw, maps)  # raw rows already sum to 1
    torch.testing.assert_close(word[:, 1], raw_word[:, 1])
    torch.testing.assert_close(special[:, 1], raw_special[:, 1])
    # head 0 by hand: word 0's row is the mean of its two subwords' rows of alpha * norm, rescaled
    wt = raw[0, 0] * norms[0, 0][None, :]
    row = wt[1:3].mean(0)
    by_hand = torch.stack([row[1] + row[2], row[3]]) / row.sum()
    torch.testing.assert_close(word[0, 0, 0], by_hand)


@pytest.fixture(scope="module")
def wp():
    return Tokenizer.train_wordpiece(TEXTS, vocab_size=60)


def test_store_key_and_index_record_the_weighting(wp, tmp_path):
    model = _model("encoder")
    sents = [t.split() for t in TEXTS[:4]]
    raw = extract(model, wp, sents, tmp_path, attentions=True, key_extra="k", progress=False)
    norm = extract(model, wp, sents, tmp_path, attentions=True, key_extra="k", attention_weighting="norm",
                   progress=False)
    assert raw.path != norm.path and raw.index["key"] != norm.index["key"]
    assert (raw.attention_weighting, norm.attention_weighting) == ("raw", "norm")
    assert norm.index["attention_weighting"] == "norm" and raw.index["attention_weighting"] == "raw"
    # raw keys are those of before the option, so stores written then keep serving
    assert raw.index["key"] == keys.store_key(raw.index["model_id"], raw.index["data_hash"], "first",
                                              wp.fingerprint(), "truncate", "k")
    # a request without attentions is served by the raw store, never the norm one
    assert extract(model, wp, sents, tmp_path, key_extra="k", progress=False).path == raw.path
    for s in range(4):
        a, sp = norm.sentence_attention(s), norm.sentence_special(s)
        live = ~np.isnan(a).all((-1, -2))  # layer 1's missing heads and layer 2 are NaN
        np.testing.assert_allclose((a.sum(-1) + sp.sum(-1))[live], 1.0, atol=1e-5)
        assert not np.allclose(a[live], raw.sentence_attention(s)[live])
    with pytest.raises(ValueError, match="attention_weighting"):
        extract(model, wp, sents, tmp_path, attention_weighting="norm", progress=False)  # no attentions
    with pytest.raises(ValueError, match="unknown attention_weighting"):
        extract(model, wp, sents, tmp_path, attentions=True, attention_weighting="grad", progress=False)
    with pytest.raises(ValueError, match="weightings"):
        HeadRunConfig(weightings=("raw", "grad"))


# ------------------------------------------------------------------------------ the pipeline
def _cls_value_zero_model(tok):
    """Layer 0, head 0 of a random encoder gets W_V rows orthogonal to the (context-free) layer-0
    input at position 0, the [CLS] embedding, and no value bias: f_0(x_[CLS]) = 0 exactly, while
    the other tokens keep non-zero values."""
    torch.manual_seed(0)
    model = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, d_ff=64,
                                  max_positions=MAX_POS, dropout=0.0)).eval()
    attn = model.blocks[0].attn
    H, Dh, D = attn.n_heads, attn.head_dim, attn.d_model
    with torch.no_grad():
        x_cls = model.embeddings(torch.tensor([[tok.cls_id]]), None)[0, 0]  # (D,): post-LN, position 0
        u = x_cls / x_cls.norm()
        rows = slice(2 * D, 2 * D + Dh)  # head 0's value rows of the fused QKV weight
        attn.qkv.weight[rows] -= (attn.qkv.weight[rows] @ u)[:, None] * u[None, :]
        attn.qkv.bias[rows] = 0.0
    return model


def _to_cls(t, name):
    """Layer 0, head 0 puts 0.9 of every row on position 0 ([CLS]), the rest as before, rescaled."""
    t = t.clone()
    rest = t[:, 0, :, 1:]
    t[:, 0, :, 1:] = 0.1 * rest / rest.sum(-1, keepdim=True).clamp_min(1e-30)
    t[:, 0, :, 0] = 0.9
    return t


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("norm_heads")
    tok = word_vocab_tokenizer(tmp)
    model = _cls_value_zero_model(tok)
    with model.hooks(fwd=[("blocks.0.attn.pattern", _to_cls)]):
        both = analyse_loaded(model, tok, tmp / "both", {**RUN.to_dict(), "weightings": ["raw", "norm"]},
                              model_name="planted", progress=False)
        raw_only = analyse_loaded(model, tok, tmp / "raw", RUN, model_name="planted", progress=False)
    return tmp, tok, model, both, raw_only


def _value(tables, weighting, layer, head, score):
    h = weighting_rows(tables["heads"], weighting)
    return float(h[(h.layer == layer) & (h["head"] == head) & (h.score == score)]["value"].iloc[0])


def test_planted_cls_head_is_a_sink_in_raw_attention_and_not_under_norm_weighting(planted):
    _, _, _, t, _ = planted
    assert _value(t, "raw", 0, 0, "attn_to_cls") == pytest.approx(0.9, abs=1e-4)
    assert _value(t, "norm", 0, 0, "attn_to_cls") < 1e-4
    assert _value(t, "norm", 0, 1, "attn_to_cls") > 1e-3  # an untouched head keeps its [CLS] share
    c = t["heads_classes"]
    roles = {w: set(g[(g.layer == 0) & (g["head"] == 0)]["role"]) for w, g in c.groupby("weighting")}
    assert "cls_sink" in roles["raw"] and "cls_sink" not in roles["norm"]
    for name, df in t.items():
        assert set(df["weighting"]) == {"raw", "norm"}, name
        assert (df["weighting"] == "raw").sum() == (df["weighting"] == "norm").sum() or name == "heads_classes"


def test_raw_tables_do_not_change_with_the_option(planted):
    _, _, _, both, raw_only = planted
    for name in ("heads", "heads_classes", "relations", "head_similarity"):
        pd.testing.assert_frame_equal(weighting_rows(both[name], "raw").reset_index(drop=True),
                                      raw_only[name].reset_index(drop=True), check_exact=True)


def test_sentence_attention_norm_matches_the_typed_sentence_view(planted, tmp_path):
    _, tok, model, _, _ = planted
    path = plmodels.save(model, tok, tmp_path / "ckpt")
    words = ["The", "keys", "are", "on", "the", "table", "."]
    raw, _ = sentence_attention(path, words)
    norm, special = sentence_attention(path, words, weighting="norm")
    np.testing.assert_allclose(norm.sum(-1) + special.sum(-1), 1.0, atol=1e-5)
    assert special[0, 0, :, 0].max() < 1e-4 and not np.allclose(raw, norm)  # the planted head (no hook here)
    net, _ = views.load_model(str(path))
    typed = views.attention_for_words(words, [], net, tok, "norm")  # the app's path, same conversion
    np.testing.assert_allclose(typed.attn, norm, atol=1e-5)


def _write_old_model(run: Path) -> None:
    """Head tables of a model written by code before the `weighting` column."""
    L, H = np.divmod(np.arange(4), 2)
    write_table(run, "heads", pd.DataFrame({"model": "old", "layer": L, "head": H, "score": "attn_to_cls",
                                            "value": [0.1, 0.2, 0.3, 0.4]}))
    write_table(run, "heads_classes", pd.DataFrame({"model": "old", "layer": L, "head": H, "role": "none",
                                                    "primary": False}))


@pytest.fixture(scope="module")
def run_root(planted, tmp_path_factory):
    """A results root whose run holds an old-schema model beside a tiny model analysed both ways
    (upserted twice: the second write must replace, not duplicate), and its checkpoint."""
    _, tok, model, _, _ = planted
    root = tmp_path_factory.mktemp("results")
    run = root / "demo"
    _write_old_model(run)
    cfg = {**RUN.to_dict(), "weightings": ["raw", "norm"]}
    for _ in range(2):
        with model.hooks(fwd=[("blocks.0.attn.pattern", _to_cls)]):
            analyse_loaded(model, tok, None, cfg, model_name="tiny", run_dir=run, store_root=root / "store",
                           progress=False)
    plmodels.save(model, tok, run / "models" / "tiny")
    return root


def test_upsert_keeps_both_weightings_and_old_rows_read_as_raw(run_root, planted):
    run = run_root / "demo"
    _, _, _, both, _ = planted
    heads = pd.read_parquet(run / "tables" / "heads.parquet")
    assert len(heads[heads.model == "tiny"]) == len(both["heads"])  # replaced on the second write
    assert heads[heads.model == "old"]["weighting"].isna().all()  # older rows: no value in the column
    assert views.head_weightings(str(run), "old") == ["raw"]
    assert views.head_weightings(str(run), "tiny") == ["raw", "norm"]
    assert views.head_grid(str(run), "old", "attn_to_cls").values[1, 1] == 0.4
    assert views.head_grid(str(run), "old", "attn_to_cls", "norm") is None
    raw = views.head_grid(str(run), "tiny", "attn_to_cls")
    norm = views.head_grid(str(run), "tiny", "attn_to_cls", "norm")
    assert raw.values[0, 0] == pytest.approx(0.9, abs=1e-4) and norm.values[0, 0] < 1e-4
    assert set(views.best_heads(str(run), "tiny")["weighting"]) == {"raw"}
    figs = analysis_figures.heads_figures({n: pd.read_parquet(run / "tables" / f"{n}.parquet") for n in
                                           ("heads", "heads_classes", "relations", "head_similarity")})
    assert {"heads_roles_tiny", "heads_roles_tiny_norm", "heads_roles_old"} <= set(figs)
    assert "heads_roles_old_norm" not in figs


def test_heads_page_shows_raw_and_norm_side_by_side(monkeypatch, run_root):
    monkeypatch.setenv("WORKBENCH_RESULTS", str(run_root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.switch_page("app_pages/heads.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="heads_model").select("tiny").run()
    at.selectbox(key="heads_color").select("attn_to_cls").run()
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert "attn_to_cls (raw attention)" in specs[0] and "attn_to_cls (norm-weighted" in specs[1]
    at.radio(key="heads_weighting").set_value("norm").run()
    assert not at.exception and not at.error
    at.radio(key="heads_source").set_value("typed sentence").run()
    at.selectbox(key="heads_ckpt").select("tiny").run()
    at.checkbox(key="heads_norm").check().run()  # its default followed the first model shown ("old": off)
    at.selectbox(key="heads_att_layer").select(0).run()
    at.selectbox(key="heads_att_head").select(0).run()
    assert not at.exception and not at.error, [e.value for e in at.exception] + [e.value for e in at.error]
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    heat = [s for s in specs if "layer 0, head 0" in s]
    assert len(heat) == 2 and "raw attention" in heat[0] and "norm-weighted" in heat[1]
    # the old-schema model: one grid, no weighting radio
    at.selectbox(key="heads_model").select("old").run()
    assert not at.exception and not at.error
    assert not [r for r in at.radio if r.key == "heads_weighting"]


def test_prune_and_summaries_read_the_raw_rows(run_root, planted):
    run = run_root / "demo"
    _, _, _, both, raw_only = planted
    roles = find_heads_classes(run / "prune" / "tiny", "tiny")  # prune's join with head roles
    assert set(roles["weighting"]) == {"raw"} and len(roles) == len(raw_only["heads_classes"])
    assert set(find_heads_classes(run / "prune" / "old", "old")["weighting"]) == {"raw"}  # old rows: raw
    s_both, s_raw = summarise_heads(both["heads"], both["relations"]), summarise_heads(raw_only["heads"],
                                                                                       raw_only["relations"])
    assert s_both == pytest.approx(s_raw, nan_ok=True)
