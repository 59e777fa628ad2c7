"""XLNet (plmodels/xlnet.py) trains like every other kind: objective "plm" (objectives.py) makes its
permutation batches from the packed rows (data.plm_batch, plm.py), lowers the held-out permutation
loss through `run_training`, saves an "xlnet" checkpoint that loads to the same hidden states,
resumes bit-exact, and lets the workbench's extraction read the content stream's L + 1 layers."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from plmodels.checkpoint import load, n_parameters
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from plmodels.training import PretrainConfig, load_config
from plmodels.training.config import PLMArgs
from plmodels.training.data import plm_batch
from plmodels.training.loop import run_training
from plmodels.training.masking import step_generator
from plmodels.training.objectives import objective_for, plm_loss
from plmodels.training.plm import permutation_batch, prediction_slots
from plmodels.xlnet import XLNet, XLNetConfig
from tests.plmodels.kinds import (assert_same_weights, assert_store_is_the_hidden_states, packed_rows,
                                  same_loss_and_grads)
from tests.plmodels.toy_runs import fixed_wordpiece, toy_config, toy_corpus
from workbench.analyses.prune import prune_model_cli
from workbench.core.paths import data_root

pytestmark = pytest.mark.usefixtures("one_thread")

RECIPE_MODEL = load_config("xlnet-tiny").model  # the recipe's family options


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("xlnet")
    data = toy_corpus(d / "train.txt", 2000, 0), toy_corpus(d / "valid.txt", 200, 1)
    return data, fixed_wordpiece(data[0], d / "tok")


def _run_cfg(corpus, **kw):
    data, tok = corpus
    run = dict(model={**RECIPE_MODEL, "dropout": 0.0}, max_steps=30, eval_sequences=16, lr=3e-3, warmup_steps=2,
               objective_args={"partial_k": 3})
    return toy_config(data, kind="xlnet", tokenizer_path=str(tok), **{**run, **kw})


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """200 steps (about 5 s): post-LN XLNet, like post-LN BERT (test_train.py), sits on the unigram
    plateau for its first hundred steps here (4.33 -> 3.19 at step 30, unigram 3.14; 2.11 at 200)."""
    cfg = _run_cfg(corpus, max_steps=200)
    out = tmp_path_factory.mktemp("xlnet-run") / "run"
    return cfg, run_training(cfg, out), out


def _rows(tok_dir, n=4, seq_len=26, seed=0):
    return packed_rows(tok_dir, n, seq_len, seed)


def test_a_trained_run_lowers_the_heldout_loss_and_loads_to_the_same_states(trained):
    cfg, result, out = trained
    assert cfg.objective == "auto" and objective_for(cfg).name == "plm"  # auto picks plm for kind xlnet
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    ev = {(r["step"], r["metric"]): r["value"] for r in rows if r["split"] == "eval"}
    assert ev[(200, "loss")] < ev[(0, "loss")] - 1.5, ev
    assert ev[(200, "loss")] < ev[(200, "unigram_loss")] - 0.5, ev  # past the unigram plateau
    assert ev[(200, "acc")] > 0.35, ev  # the most frequent token alone scores 0.19
    card = json.loads((result.path / "card.json").read_text())
    assert card["kind"] == "xlnet" and card["objective_name"] == "plm"
    assert "permutation LM" in card["objective"] and "1/3" in card["objective"]
    assert card["n_heads_per_layer"] == [2, 2]
    model, tok = load(result.path)
    assert isinstance(model, XLNet) and model.config == result.model.config
    assert model.config.vocab_size == tok.vocab_size
    ids = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    result.model.eval()
    a = result.model(ids, output_hidden_states=True)
    b = model(ids, output_hidden_states=True)
    assert len(b.hidden_states) == 3 and all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states))


def test_a_killed_run_resumes_to_bit_identical_weights(corpus, tmp_path):
    """Dropout on: its RNG and the permutation generator replay too."""
    cfg = _run_cfg(corpus, model={**RECIPE_MODEL, "dropout": 0.1}, eval_every=4, max_steps=12)
    result = run_training(cfg, tmp_path / "a")
    killed = run_training(cfg, tmp_path / "b", stop_at_step=8)  # last checkpoint: step 8 (log-spaced)
    assert killed.path is None
    resumed = run_training(cfg, tmp_path / "b")
    assert_same_weights(result.model.state_dict(), resumed.model.state_dict())


def test_a_plm_batch_predicts_the_last_kth_of_the_words_and_never_the_specials(corpus):
    tok, rows = _rows(corpus[1])
    b = plm_batch(rows, tok, PLMArgs(partial_k=4), step_generator(0, 0), "cpu")
    again = plm_batch(rows, tok, PLMArgs(partial_k=4), step_generator(0, 0), "cpu")
    assert torch.equal(b.extras["perm_mask"], again.extras["perm_mask"])  # a pure function of the generator
    assert b.extras["attention_mask"] is None and torch.equal(b.input_ids, rows)
    tm, perm = b.extras["target_mapping"], b.extras["perm_mask"].bool()
    assert tm.shape == (4, 24 // 4, 26) and bool((b.labels != -100).all())  # 24 words a row, 6 targets
    pos = tm.argmax(2)  # (B, P)
    assert not bool(((pos == 0) | (pos == 25)).any())  # [CLS] and [SEP] are context, never targets
    assert torch.equal(b.labels, rows.gather(1, pos))
    target = tm.sum(1).bool()  # (B, T)
    for r in range(4):  # all see every non-target; a target never sees itself, the targets see each
        assert not bool(perm[r][:, ~target[r]].any())  # other in a strict order
        t = target[r].nonzero().flatten()
        assert bool(perm[r, t, t].all())
        seen = (~perm[r][t][:, t]).sum(1).sort().values
        assert seen.tolist() == list(range(len(t)))


def test_the_loss_is_the_query_streams_cross_entropy_at_the_targets(corpus):
    tok, rows = _rows(corpus[1])
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(**{**preset("xlnet", "tiny"), "dropout": 0.0}, vocab_size=tok.vocab_size))
    b = plm_batch(rows, tok, PLMArgs(partial_k=3), step_generator(0, 2), "cpu")
    loss, n, parts = plm_loss(model, b, autocast=False)
    e = b.extras
    logits = model(rows, perm_mask=e["perm_mask"], target_mapping=e["target_mapping"], attn_impl="eager").logits
    assert n == 4 * (24 // 3) and parts == {}
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), b.labels.flatten()))
    loss.backward()
    assert model.mask_emb.grad.abs().sum() > 0  # the query stream's input is trained


def test_the_loss_and_gradients_over_every_query_row_are_the_selected_targets(corpus):
    # plm_loss feeds every query row to the fused loss, the padding rows (-100) weighing nothing, and
    # skips the model's one-hot check of target_mapping (a host read): its loss and one step's
    # gradients equal cross-entropy at the rows picked out by a mask (before issue 81), fp32, 1e-6.
    # Rows with fewer targets than P: a row whose last two targets are dropped from the mapping.
    tok, rows = _rows(corpus[1])
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(**{**preset("xlnet", "tiny"), "dropout": 0.0}, vocab_size=tok.vocab_size))
    b = plm_batch(rows, tok, PLMArgs(partial_k=3), step_generator(0, 2), "cpu")
    b.labels[1, -2:] = -100
    b.extras["target_mapping"][1, -2:] = 0.0
    params = list(model.parameters())
    loss, n, _ = plm_loss(model, b, autocast=False)
    got = torch.autograd.grad(loss, params, allow_unused=True)
    e = b.extras
    out = model(rows, perm_mask=e["perm_mask"], target_mapping=e["target_mapping"])
    sel = b.labels != -100
    ref = F.cross_entropy(out.logits[sel], b.labels[sel])
    want = torch.autograd.grad(ref, params, allow_unused=True)
    assert int(n) == int(sel.sum()) == 4 * (24 // 3) - 2
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    for (name, _), g, w in zip(model.named_parameters(), got, want):
        assert (g is None) == (w is None), name
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=name)
    # a caller's target_mapping is still checked, the trainer's (check_targets=False) not
    bad = e["target_mapping"].clone()
    bad[0, 0, :2] = 1.0
    with pytest.raises(ValueError, match="one-hot"):
        model(rows, perm_mask=e["perm_mask"], target_mapping=bad)
    model(rows, perm_mask=e["perm_mask"], target_mapping=bad, check_targets=False)


def test_static_prediction_slots_give_the_loss_and_gradients_of_the_batchs_own_count(corpus):
    # a compiled run pads every batch's predicted set to prediction_slots(T, K) rows (static shapes,
    # issue 81): the same draws, zero rows and -100 labels past the targets, and the loss and one
    # step's gradients of the batch's own P (fp32, 1e-6). Document breaks ([SEP]) inside the rows
    # leave fewer predictable tokens: 2 in every row (22 // 3 = 7 targets) and 5 more in the last
    # (17 // 3 = 5), so the own P is 7 and the static one 26 // 3 = 8.
    tok, rows = _rows(corpus[1])
    rows[:, 5:7] = tok.sep_id
    rows[-1, 10:15] = tok.sep_id
    args = PLMArgs(partial_k=3)
    own = plm_batch(rows, tok, args, step_generator(0, 2), "cpu")
    fixed = plm_batch(rows, tok, args, step_generator(0, 2), "cpu", static=True)
    assert prediction_slots(26, 3) == 8 and own.labels.shape == (4, 7) and fixed.labels.shape == (4, 8)
    assert torch.equal(fixed.extras["perm_mask"], own.extras["perm_mask"])
    assert torch.equal(fixed.labels[:, :7], own.labels) and bool((fixed.labels[:, 7] == -100).all())
    tm = fixed.extras["target_mapping"]
    assert torch.equal(tm[:, :7], own.extras["target_mapping"]) and not bool(tm[:, 7].any())
    assert int((own.labels != -100).sum()) == 3 * 7 + 5
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(**{**preset("xlnet", "tiny"), "dropout": 0.0}, vocab_size=tok.vocab_size))
    assert same_loss_and_grads(model, plm_loss, own, fixed) == 3 * 7 + 5
    # a count over the slots is refused, not cut
    with pytest.raises(ValueError, match=r"n_slots=6 must be in \[7, T=26\]"):
        permutation_batch(rows, partial_k=3, predictable=rows != tok.sep_id, generator=step_generator(0, 2),
                          n_slots=6)


def test_the_workbench_call_gives_the_content_streams_l_plus_1_states():
    torch.manual_seed(0)
    model = XLNet(XLNetConfig(vocab_size=61, d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=0.0)).eval()
    ids = torch.randint(5, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    eager = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, attn_impl="eager",
                  unpad=True)
    fast = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=False, attn_impl="sdpa",
                 unpad=True)
    assert model.n_heads_per_layer == [2, 2] and len(eager.hidden_states) == 3 and len(eager.attentions) == 2
    assert eager.query_hidden_state is None and fast.attentions is None
    assert torch.all(eager.last_hidden_state[1, 4:] == 0)  # unpad: zero at the padding
    for h, g in zip(eager.hidden_states, fast.hidden_states):
        torch.testing.assert_close(h, g)
    alone = model(ids[1:, :4], output_hidden_states=True)  # padding changes nothing at the real tokens
    torch.testing.assert_close(eager.hidden_states[-1][1, :4], alone.hidden_states[-1][0])


def test_extraction_writes_the_content_streams_l_plus_1_layers(trained, tmp_path):
    assert_store_is_the_hidden_states(trained[1].path, tmp_path / "store", "xlnet", attentions=True)


def test_objective_args_and_the_objective_are_checked():
    base = dict(kind="xlnet", train_source="x", preset="tiny")
    with pytest.raises(ValueError, match="partial_kk"):
        PretrainConfig.from_dict({**base, "objective_args": {"partial_kk": 3}})
    with pytest.raises(ValueError, match="partial_k must be an int >= 1"):
        PretrainConfig.from_dict({**base, "objective": "plm", "objective_args": {"partial_k": 0}})
    with pytest.raises(ValueError, match="trains an encoder"):
        PretrainConfig.from_dict({**base, "objective": "mlm"})
    with pytest.raises(ValueError, match="trains an xlnet"):
        PretrainConfig.from_dict({**base, "kind": "encoder", "objective": "plm"})
    assert PLMArgs().partial_k == 6


def test_the_recipes_and_the_mini_shape_match_bert_mini():
    mini, tiny = load_config("xlnet-mini"), load_config("xlnet-tiny")
    assert (mini.kind, mini.objective, mini.objective_args) == ("xlnet", "plm", {"partial_k": 6})
    assert tiny.objective_args == mini.objective_args and (mini.preset, tiny.preset) == ("mini", "tiny")
    shape = preset("xlnet", "mini")
    assert (shape["n_layers"], shape["d_model"], shape["n_heads"], shape["d_ff"]) == (4, 256, 4, 1024)
    bert = n_parameters(Encoder(EncoderConfig(**preset("encoder", "mini"), vocab_size=16000)))
    ours = n_parameters(XLNet(XLNetConfig(**{**shape, **mini.model}, vocab_size=16000)))
    assert (ours, bert) == (7_534_464, 7_535_232)


@pytest.mark.skipif(not (data_root() / "ud_english_ewt").is_dir(), reason="data root missing")
def test_prune_scores_xlnet_heads_on_its_own_plm_loss_and_a_dead_head_scores_zero(trained, tmp_path):
    """`workbench prune` on an XLNet checkpoint: the run's partial prediction replayed on fixed orders,
    Michel per batch (a gate acts on both streams), ablation; a head whose output projection is zero
    (it adds nothing to either stream) scores exactly 0, and only it."""
    cfg, result, out = trained
    run = tmp_path / "run"
    shutil.copytree(out, run)
    model, _ = load(run / "final")
    H, D = model.config.n_heads, model.config.d_model
    with torch.no_grad():
        model.blocks[1].attn.o.weight[:, D // H: 2 * D // H] = 0.0  # layer 1, head 1
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(run / "final" / "model.safetensors"))
    pcfg = {"eval_data": "ewt", "n_sequences": 8, "batch_size": 4, "fractions": [0.0, 0.5, 1.0], "random_seeds": [0],
            "l0_lambdas": [], "tolerances": [0.05]}
    tables = prune_model_cli(run / "final", ["michel", "ablation", "random"], tmp_path / "out", pcfg, progress=False)
    imp = tables["importance"]
    for method, g in imp.groupby("method"):
        dead = (g["layer"] == 1) & (g["head"] == 1)
        assert g.loc[dead, "value"].abs().max() < 1e-6, method
        assert (g.loc[~dead, "value"].abs() > 1e-6).all(), method
    assert set(tables["pruning"]["metric"]) == {"plm_loss"} and tables["pruned_speed"].empty
    record = json.loads((tmp_path / "out" / "prune_run.json").read_text())
    assert record["config"]["granularity"] == "batch" and any("granularity 'batch'" in n for n in record["notes"])
    assert "permutation-LM loss" in record["objective"]
