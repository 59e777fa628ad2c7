"""workbench.presentation.views: the tables the app shows, checked against values planted in the fixture and
computed by hand; the model calls against a direct forward pass and the attention store."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.apps.results_fixtures import partial_root, results_root, run_dir  # noqa: F401  (fixtures)
from tests.apps.fixtures import BEST_HEAD, PEAK_LAYER, SENTENCES
from workbench.presentation import views


def test_over_seeds_prefers_the_aggregate_row_and_averages_otherwise():
    df = pd.DataFrame({"k": ["a", "a", "a", "b", "b"], "seed": [0, 1, -1, 0, 1],
                       "value": [1.0, 3.0, 2.5, 4.0, 6.0]})
    out = views._over_seeds(df, ["k"]).set_index("k")["value"]
    assert out["a"] == 2.5 and out["b"] == 5.0


def test_layer_scores_peak_where_planted(run_dir):
    df = views.layer_scores(run_dir, "accuracy")
    assert set(df["model"]) == {"enc", "enc-ft"} and df["layer"].min() == 0 and df["layer"].max() == 12
    peaks = df[df["model"] == "enc"].groupby("task").apply(lambda g: int(g.loc[g["value"].idxmax(), "layer"]),
                                                            include_groups=False)
    assert peaks.to_dict() == PEAK_LAYER


def test_layer_summary_puts_baselines_beside_the_score(run_dir):
    t = views.layer_summary(run_dir).set_index(["model", "task"])
    row = t.loc[("enc", "pos")]
    assert row["best_layer"] == PEAK_LAYER["pos"] and row["best"] == pytest.approx(0.9)
    assert row["lexical"] == pytest.approx(0.9 - 0.03 * 3)          # layer 0
    assert row["control"] == pytest.approx(0.9 - 0.3)
    assert row["mix"] == pytest.approx(0.91)
    assert row["expected_layer"] == pytest.approx(3.0, abs=0.01) and row["selectivity"] == 0.3


def test_layer_summary_reads_the_held_out_best_layer_when_the_table_has_one():
    # in sample, layer 2 has the maximum (0.80); the held-out choice (mode "best") is layer 1 at 0.74
    base = dict(model="m", task="pos", probe="edge", pooling="first", metric="accuracy", seed=0, ci_low=0.0,
                ci_high=1.0)
    rows = [dict(base, layer=l, mode="single", value=v) for l, v in enumerate([0.60, 0.78, 0.80])]
    probing = pd.DataFrame(rows + [dict(base, layer=1, mode="best", value=0.74)])
    row = views.layer_summary_frame(probing).iloc[0]
    assert (row["best_layer"], row["best"], row["lexical"]) == (1, pytest.approx(0.74), pytest.approx(0.60))
    probing.loc[probing["mode"] == "best", "layer"] = -1           # the two halves chose differently
    assert np.isnan(views.layer_summary_frame(probing).iloc[0]["best_layer"])
    row = views.layer_summary_frame(probing[probing["mode"] == "single"]).iloc[0]  # an older table
    assert (row["best_layer"], row["best"]) == (2, pytest.approx(0.80))


def test_head_grids(run_dir):
    roles = views.head_grid(run_dir, "enc", "role")
    assert roles.values.shape == (12, 12) and roles.categories == tuple(sorted(roles.categories))
    assert roles.labels[0, 0] == "positional" and roles.categories[int(roles.values[0, 0])] == "positional"
    prev = views.head_grid(run_dir, "enc", "prev_token")
    assert np.unravel_index(np.nanargmax(prev.values), prev.values.shape) == (0, 1)
    assert views.head_scores(run_dir, "enc") == ["entropy", "prev_token"]
    best = views.best_heads(run_dir, "enc").set_index("relation")
    assert (best.loc["nsubj", "best_layer"], best.loc["nsubj", "best_head"]) == BEST_HEAD["nsubj"]
    hmap = views.head_map(run_dir, "enc")
    assert len(hmap) == 144 and {"x", "y", "role"} <= set(hmap.columns)


def test_pruning_curves_mean_and_std_over_seeds(run_dir):
    df = views.pruning_curves(run_dir, "accuracy")
    r = df[(df["method"] == "random") & (df["fraction"] == 0.9)].iloc[0]
    assert r["value"] == pytest.approx(0.9 - 0.6 * 0.81) and r["std"] == 0.0


def test_compare_views(run_dir):
    m = views.cka_matrix(run_dir, "enc", "enc-ft", "linear")
    assert m.shape == (13, 13) and m[2, 5] == pytest.approx(np.exp(-1.0))
    assert views.cka_pairs(run_dir) == [("enc", "enc-ft", "linear")]
    d = views.probing_deltas(run_dir, "enc", "enc-ft")
    assert np.allclose(d["delta"], 0.02) and len(d) == 3 * 13
    hc = views.head_change_grid(run_dir, "enc", "enc-ft")
    assert hc.values[11, 0] == pytest.approx(0.5) and hc.values[0, 3] == 0


def test_missing_tables_are_none_and_name_their_command(partial_root):
    run = str(partial_root / "bare")
    assert views.layer_scores(run) is None and views.head_grid(run, "m", "role") is None
    assert views.cka_matrix(run, "a", "b", "linear") is None and views.pruning_curves(run) is None
    assert views.missing_command("probing") == "workbench probe MODEL"
    assert views.missing_command("cka") == "workbench compare A B"


def test_typed_attention_matches_the_attention_store(run_dir):
    """The on-the-fly word attention of a corpus sentence equals the stored one (same model)."""
    paths = views.model_paths(run_dir)
    s = 1
    stored = views.stored_attention(run_dir, "tiny-enc", s)
    typed = views.attention_for_text(paths["tiny-enc"], " ".join(SENTENCES[s]))
    assert typed.words == SENTENCES[s] == stored.words
    np.testing.assert_allclose(typed.attn, stored.attn, atol=2e-3)
    # word rows plus the special-token shares sum to 1, so word rows alone are at most 1
    assert (typed.attn.sum(-1) <= 1 + 1e-5).all()
    assert typed.attn.shape == (2, 2, len(SENTENCES[s]), len(SENTENCES[s]))
    assert all(0 <= d < len(typed.words) and 0 <= h < len(typed.words) for d, h, _ in typed.arcs)
    assert any(lab == "det" for *_, lab in typed.arcs)        # spaCy parsed "a dog" / "the ball"


def test_decoder_attention_is_causal(run_dir):
    sa = views.attention_for_text(views.model_paths(run_dir)["tiny-dec"], "the cat sat on the mat")
    assert np.allclose(np.triu(sa.attn, k=1), 0)


def test_masked_predictions_match_a_direct_forward(run_dir):
    model, tok = views.load_model(views.model_paths(run_dir)["tiny-enc"])
    df = views.masked_predictions(model, tok, "the cat [MASK] on the mat .", k=3)
    ids = [tok.cls_id] + tok.encode("the cat ", add_special=False) + [tok.mask_id] + \
        tok.encode(" on the mat .", add_special=False) + [tok.sep_id]
    with torch.inference_mode():
        h = model(torch.tensor([ids])).last_hidden_state[0, ids.index(tok.mask_id)]
        p = model.mlm_logits(h).softmax(-1)
    assert df["prob"].tolist() == pytest.approx(p.topk(3).values.tolist(), rel=1e-5)
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        views.masked_predictions(model, tok, "no mask here")


def test_continuation_is_greedy(run_dir):
    model, tok = views.load_model(views.model_paths(run_dir)["tiny-dec"])
    text, top = views.continuations(model, tok, "the cat", n_new=3, k=4)
    ids = tok.encode("the cat")
    with torch.inference_mode():
        first = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    assert top["prob"].is_monotonic_decreasing and len(top) == 4
    assert tok.decode([first]) == top["token"].iloc[0] and text.startswith(tok.decode([first]))


def test_head_floors_put_each_role_scores_best_head_beside_its_floors():
    base = dict(model="m", weighting="raw", floor_uniform=0.47, floor_random_argmax=0.06, floor_random_init=0.49,
                floor=0.49)
    heads = pd.DataFrame([
        dict(base, layer=0, head=0, score="rare_token", value=0.60, ci_low=0.55, ci_high=0.65),   # beats 0.49
        dict(base, layer=0, head=1, score="rare_token", value=0.52, ci_low=0.47, ci_high=0.57),   # touches it
        dict(base, layer=1, head=0, score="rare_token", value=0.40, ci_low=np.nan, ci_high=np.nan),
        dict(base, layer=0, head=0, score="syntactic_margin:det:dep2head", value=0.3, ci_low=0.2, ci_high=0.4),
        dict(base, layer=0, head=0, score="confidence", value=0.9, ci_low=np.nan, ci_high=np.nan),  # no role
        dict(model="m", weighting="raw", layer=0, head=0, score="entropy", value=1.0)])
    f = views.head_floors_frame(heads, "m").set_index("score")
    assert list(f.index) == ["rare_token"]   # syntactic margins: the relations table; no role, no floor: left out
    r = f.loc["rare_token"]
    assert (r["best"], r["best_layer"], r["best_head"], r["n_pass"]) == (0.60, 0, 0, 1)
    assert (r["floor"], r["floor_uniform"], r["ci_low"]) == (0.49, 0.47, 0.55)
    assert views.head_floors_frame(heads.drop(columns=[c for c in heads if c.startswith("floor")]), "m") is None
