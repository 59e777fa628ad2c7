"""workbench.analyses.prune glue on a tiny encoder and a tiny finetuned classifier: the importance table has
L*H rows per method, every pruning curve starts at the unmasked metric, the really pruned
checkpoint is smaller and gives the same outputs as masking, and unknown config keys are errors."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

import plmodels
from plmodels.checkpoint import build_model
from plmodels.families import preset
from plmodels.tokenizer import Tokenizer
from plmodels.training.finetune import TaskData, finetune
from probes.importance import forward
from workbench.analyses.prune import PruneRunConfig, build_objective, michel_order_mask, prune_model_cli
from workbench.data.tasks import ud_sentences

L, H = 2, 4
CFG = dict(methods=["michel", "ablation", "confidence", "l0", "random"], eval_data="ewt", n_sequences=12,
           seq_len=32, batch_size=6, random_seeds=[0, 1], l0_lambdas=[0.0, 0.1], l0_steps=5, speed_repeats=1,
           speed_batches=1, num_threads=1)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:300]]
    tok = Tokenizer.train_wordpiece(texts, 300)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "n_heads": H, "n_layers": L, "d_model": 32, "d_ff": 64,
              "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    path = tmp_path_factory.mktemp("enc") / "tiny"
    plmodels.save(build_model("encoder", fields), tok, path)
    return path


@pytest.fixture(scope="module")
def run(encoder_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("prune")
    tables = prune_model_cli(encoder_dir, methods=CFG["methods"], out_dir=out, config=CFG, model_name="tiny",
                             progress=False)
    return out, tables


def test_importance_has_every_head_per_method(run):
    _, t = run
    imp = t["importance"]
    assert list(imp.columns) == ["model", "method", "layer", "head", "value"]
    counts = imp.groupby("method").size()
    assert set(counts.index) == {"michel", "ablation", "confidence", "l0"}
    assert (counts == L * H).all()
    for _, g in imp.groupby("method"):
        assert set(zip(g.layer, g["head"])) == {(l, h) for l in range(L) for h in range(H)}
    assert np.isfinite(imp.value).all()


def test_curves_start_at_unmasked_metric(run, encoder_dir):
    _, t = run
    model, _, obj = build_objective(encoder_dir, PruneRunConfig.from_dict(CFG))
    base = obj.metric(model, obj.curve_batches)          # the curves are measured on held-out batches
    assert obj.metric(model, obj.batches) != pytest.approx(base)
    p = t["pruning"]
    assert list(p.columns) == ["model", "method", "fraction", "metric", "value", "seed"]
    assert set(p.method) >= {"michel", "ablation", "confidence", "l0", "random", "l0_sweep"}
    zero = p[(p.fraction == 0.0) & (p.method != "l0_sweep")]
    assert len(zero) == 4 + 2  # four scored orders + two random seeds
    np.testing.assert_allclose(zero.value, base, rtol=1e-6)
    full = p[(p.fraction == 1.0) & (p.method == "michel")].value.iloc[0]
    assert full != pytest.approx(base)  # removing every head changes the loss
    assert set(t["prunable"].tolerance) == {0.01, 0.05}
    k = t["kendall"]
    assert len(k) == 6 and k.tau.between(-1, 1).all()  # 4 methods -> 6 pairs


def test_real_pruning_is_smaller_and_equals_masking(run, encoder_dir):
    out, t = run
    sp = t["pruned_speed"].set_index("variant")
    assert sp.loc["pruned", "params"] < sp.loc["full", "params"]
    assert sp.loc["pruned", "bytes"] < sp.loc["full", "bytes"]
    info = json.loads((out / "prune_run.json").read_text())
    assert info["real_pruning"]["max_abs_diff_vs_masking"] < 1e-5
    # the saved pruned checkpoint reloads in its pruned shape and matches masking the full model
    pruned, _ = plmodels.load(out / "pruned")
    assert sum(pruned.n_heads_per_layer) == L * H // 2
    full, _ = plmodels.load(encoder_dir)
    imp = t["importance"]
    scores = imp[imp.method == "michel"].sort_values(["layer", "head"]).value.to_numpy().reshape(L, H)
    mask = michel_order_mask(scores, 0.5)
    _, _, obj = build_objective(encoder_dir, PruneRunConfig.from_dict(CFG))
    batch = obj.batches[0]
    with torch.no_grad():
        a = forward(full, batch, mask).last_hidden_state
        b = forward(pruned, batch).last_hidden_state
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-5, rtol=1e-5)
    assert (out / "tables" / "importance.parquet").exists()


def test_roles_join_when_heads_classes_given(encoder_dir, tmp_path):
    roles = pd.DataFrame({"model": "tiny", "layer": [0, 1], "head": [0, 1], "role": ["positional:-1", "sink"]})
    cfg = {**CFG, "methods": ["confidence"], "l0_lambdas": []}
    t = prune_model_cli(encoder_dir, methods=["confidence"], out_dir=None, config=cfg, model_name="tiny",
                        heads_classes=roles, progress=False)
    r = t["roles_importance"]
    assert set(r.role) == {"positional:-1", "sink"} and (r.n_role == 1).all()


def test_progress_bar_counts_pruning_curves(encoder_dir, capsys):
    cfg = {**CFG, "methods": ["confidence", "random"], "l0_lambdas": []}
    prune_model_cli(encoder_dir, methods=cfg["methods"], config=cfg, model_name="tiny")
    err = capsys.readouterr().err.splitlines()
    bars = [line for line in err if " curve [" in line]
    last = bars[-1]  # a rate below 1/s reads s/curve
    assert last.startswith("prune tiny: 100% 2/2 curve [") and ("curve/s" in last or "s/curve" in last), err
    assert any(line.startswith("[prune] tiny: confidence scored and pruned in ") for line in err)


def test_classifier_objective_from_finetuned_folder(encoder_dir, tmp_path):
    rng = np.random.default_rng(0)
    words = ["good", "bad", "film", "plot", "the", "a"]
    ex = [(" ".join(rng.choice(words, 5)), int(rng.integers(2))) for _ in range(40)]
    ft = finetune(_ft_cfg(encoder_dir), tmp_path / "ft", data=TaskData("sentence", ["negative", "positive"], ex, ex))
    cfg = {**CFG, "eval_data": "auto", "methods": ["michel", "random"], "n_sequences": 24, "l0_lambdas": []}
    t = prune_model_cli(ft, methods=["michel", "random"], out_dir=tmp_path / "out", config=cfg,
                        model_name="ft", progress=False)
    p = t["pruning"]
    assert set(p.metric) == {"sst2_accuracy"}
    assert p.value.between(0, 1).all()
    assert len(t["importance"]) == L * H
    assert (tmp_path / "out" / "pruned" / "head.safetensors").exists()  # the pruned classifier keeps its head


def _ft_cfg(base):
    from plmodels.training.finetune import FinetuneConfig
    return FinetuneConfig(base=str(base), task="sst2", mode="frozen", epochs=1, batch_size=16, lr=1e-2,
                          num_threads=1)


def test_unknown_config_key_is_an_error():
    with pytest.raises(ValueError, match="unknown key 'n_sentencez'"):
        PruneRunConfig.from_dict({"n_sentencez": 3})
    with pytest.raises(ValueError, match="methods"):
        PruneRunConfig.from_dict({"methods": ["michel", "magic"]})
    with pytest.raises(ValueError, match="fractions"):
        PruneRunConfig.from_dict({"fractions": [0.5, 1.0]})


def test_heads_are_scored_and_curves_measured_on_disjoint_sequences(encoder_dir):
    cfg = PruneRunConfig.from_dict(CFG)
    _, tok, obj = build_objective(encoder_dir, cfg)
    rows = lambda bs: {tuple(r[m.bool()].tolist()) for b in bs for r, m in zip(b["input_ids"], b["attention_mask"])}  # noqa: E731
    assert sum(len(b["input_ids"]) for b in obj.batches) == sum(len(b["input_ids"]) for b in obj.curve_batches) == 12
    assert not rows(obj.batches) & rows(obj.curve_batches)
    assert "held-out" in obj.description and obj.special_ids == tuple(tok.special_ids)
    same = build_objective(encoder_dir, PruneRunConfig.from_dict({**CFG, "heldout": False}))[2]
    assert same.curve_batches is same.batches and "the same" in same.description



def test_shared_heads_are_ranked_and_removed_as_one_unit():
    # layers 0 and 1 share attention weights (ALBERT), layer 2 does not; 3 x 2 heads, half to prune
    scores = np.array([[0.1, 0.9], [0.5, 0.8], [0.2, 0.3]])
    mask = michel_order_mask(scores, 0.5, groups=[[0, 1]])
    # units by mean score: layer 2 head 0 (0.2), shared head 0 (0.3), layer 2 head 1 (0.3), shared head 1 (0.85)
    assert mask.tolist() == [[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]]
    assert michel_order_mask(scores, 0.5).tolist() == [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]  # unshared: per head


def test_albert_sharing_prunes_for_real(tmp_path):
    # an all-shared encoder: the real pruning step removes whole shared heads and matches masking
    texts = [" ".join(s.words) for s in ud_sentences("ewt", "train")[:300]]
    tok = Tokenizer.train_wordpiece(texts, 300)
    torch.manual_seed(0)
    fields = {**preset("encoder", "tiny"), "n_heads": H, "n_layers": 3, "d_model": 32, "d_ff": 64, "embedding_size": 16,
              "share_layers": "all", "vocab_size": tok.vocab_size, "dropout": 0.0, "pad_token_id": tok.pad_id}
    plmodels.save(build_model("encoder", fields), tok, tmp_path / "albert")
    cfg = {**CFG, "methods": ["michel", "random"]}
    prune_model_cli(tmp_path / "albert", methods=cfg["methods"], out_dir=tmp_path / "out", config=cfg,
                    model_name="albert", progress=False)
    info = json.loads((tmp_path / "out" / "prune_run.json").read_text())["real_pruning"]
    assert info["max_abs_diff_vs_masking"] < 1e-5
    heads = {int(k): v for k, v in info["pruned_heads"].items()}
    assert len({tuple(v) for v in heads.values()}) == 1 and len(heads[0]) == 2  # the same 2 of 4 heads everywhere
    pruned, _ = plmodels.load(tmp_path / "out" / "pruned")
    assert pruned.n_heads_per_layer == [2, 2, 2] and pruned.blocks[2].attn.qkv.weight is pruned.blocks[0].attn.qkv.weight
