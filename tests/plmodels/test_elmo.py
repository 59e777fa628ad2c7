"""ELMo's biLM (plmodels/elmo.py) and its transformer control: each direction sees only its own side
of a token, padding never reaches a real token, the representations and the loss are the paper's,
and both train with their objective ("bilm", "tbilm"), save, load and extract like the transformer
families."""
import json

import numpy as np
import pytest
import torch

from plmodels.checkpoint import load
from plmodels.elmo import (
    ElmoBiLM,
    ElmoConfig,
    TransformerBiLM,
    TransformerBiLMConfig,
    bilm_loss,
    reverse_padded,
)
from plmodels.training import PretrainConfig
from plmodels.training.finetune import Classifier
from plmodels.training.loop import run_training
from plmodels.training.loss import linear_cross_entropy
from probes.importance import michel_importance
from probes.pruning import bilm_stat
from tests.plmodels.kinds import assert_store_is_the_hidden_states
from tests.plmodels.toy_runs import fixed_wordpiece, toy_config, toy_corpus
from workbench.analyses.amnesic import AmnesicRunConfig, held_out, run_model
from workbench.analyses.emergence import emergence_cli
from workbench.analyses.gating import gate_model
from workbench.analyses.heads import analyse_heads
from workbench.analyses.prune import prune_model_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: torch's thread pool only adds contention

TINY = dict(vocab_size=61, d_embed=8, d_hidden=24, d_proj=8, n_layers=2, dropout=0.1)


TINY_T = dict(vocab_size=61, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_positions=16, dropout=0.1)


def tiny(**overrides) -> ElmoBiLM:
    torch.manual_seed(0)
    return ElmoBiLM(ElmoConfig(**{**TINY, **overrides})).eval()


def tiny_t(**overrides) -> TransformerBiLM:
    torch.manual_seed(0)
    return TransformerBiLM(TransformerBiLMConfig(**{**TINY_T, **overrides})).eval()


MODELS = {"bilm": tiny, "tbilm": tiny_t, "tbilm-rope": lambda: tiny_t(position="rope"),
          "tbilm-alibi": lambda: tiny_t(position="alibi")}  # all with P = 8 per direction


def padded_batch():
    """ids (3, 9) and a right-padded mask: lengths 9, 5, 2."""
    ids = torch.randint(5, 61, (3, 9), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([9, 5, 2])
    mask = (torch.arange(9) < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask, lengths


def layers_of(model, ids, mask, embed):
    """Run the model with `embed` (B, T, 2P) substituted at the `embed` site; {site: tensor}."""
    got = {}
    sites = [f"blocks.{l}.{d}" for l in range(model.config.n_layers) for d in ("fwd", "bwd")]
    with model.hooks([("embed", lambda x, n: embed)] + [(s, lambda x, n: got.__setitem__(n, x)) for s in sites]):
        model(ids, attention_mask=mask)
    return got


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_each_direction_reads_only_its_side_of_the_token_with_padding(kind):
    model = MODELS[kind]()
    ids, mask, lengths = padded_batch()
    x = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states[0]
    embed = x.detach().clone().requires_grad_(True)  # the input embeddings [x; x], (B, T, 2P)
    got = layers_of(model, ids, mask, embed)
    B, T = ids.shape
    for site, h in got.items():
        backward = site.endswith("bwd")
        for b in range(B):
            n = int(lengths[b])
            for t in range(n):
                (g,) = torch.autograd.grad(h[b, t].sum(), embed, retain_graph=True)
                dep = g.abs().sum(-1)  # (B, T): how much h[b, t] moves with the embedding at (b', s)
                s = torch.arange(T)
                unseen = (s < t) if backward else (s > t)  # the other side of t ...
                unseen = unseen | (s >= n)  # ... and the padding
                assert torch.all(dep[b, unseen] == 0), (site, b, t)  # exactly zero
                assert torch.all(dep[torch.arange(B) != b] == 0), (site, b, t)  # other rows
                assert dep[b, t] > 0 and dep[b, n - 1 if backward else 0] > 0, (site, b, t)  # reads its side


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_sentence_reads_the_same_alone_and_in_a_padded_batch(kind):
    model = MODELS[kind]()
    ids, mask, lengths = padded_batch()
    batched = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for b, n in enumerate(lengths.tolist()):
        alone = model(ids[b:b + 1, :n], output_hidden_states=True).hidden_states
        for l, (hb, ha) in enumerate(zip(batched, alone)):
            torch.testing.assert_close(hb[b, :n], ha[0], atol=1e-5, rtol=1e-5, msg=f"layer {l} row {b}")
        if kind != "bilm":
            continue
        # an independent reference for layer 1: the two LSTMs on the unpadded row, flipped with .flip
        e = model.wte(ids[b, :n])
        blk = model.blocks[0]
        fwd = blk.fwd_lstm(e[None])[0][0]
        bwd = blk.bwd_lstm(e.flip(0)[None])[0][0].flip(0)
        torch.testing.assert_close(batched[1][b, :n], torch.cat([fwd, bwd], -1), atol=1e-5, rtol=1e-5)


def test_reverse_padded_flips_the_real_tokens_only():
    x = torch.arange(12.0).view(2, 6, 1)
    out = reverse_padded(x, torch.tensor([6, 4]))[..., 0]
    assert out.tolist() == [[5, 4, 3, 2, 1, 0], [9, 8, 7, 6, 10, 11]]
    assert torch.equal(reverse_padded(reverse_padded(x, torch.tensor([6, 4])), torch.tensor([6, 4])), x)


@pytest.mark.parametrize("d_embed", [8, 12])
def test_hidden_states_layout_and_layer_0_is_x_x(d_embed):
    model = tiny(d_embed=d_embed)
    cfg = model.config
    ids, mask, _ = padded_batch()
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    P = cfg.d_proj
    assert cfg.d_model == 2 * P and cfg.n_heads == 0 and model.n_heads_per_layer == [0, 0] and model.kind == "bilm"
    assert len(out.hidden_states) == cfg.n_layers + 1 and out.attentions is None
    assert all(h.shape == (3, 9, 2 * P) for h in out.hidden_states)
    assert out.last_hidden_state is out.hidden_states[-1]
    x = model.wte(ids) if d_embed == P else model.embed_proj(model.wte(ids))
    assert torch.equal(out.hidden_states[0], torch.cat([x, x], -1))
    # the residual from layer 1 to 2 (not from the embeddings to layer 1)
    assert not model.blocks[0].residual and model.blocks[1].residual
    assert model.hook_names() == ["embed", "blocks.0.fwd", "blocks.0.bwd", "blocks.0.resid_post",
                                  "blocks.1.fwd", "blocks.1.bwd", "blocks.1.resid_post"]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_an_edit_at_resid_post_reaches_the_layers_above(kind):
    """Amnesic probing edits `blocks.{l}.resid_post`: the next layer must read the edited tensor."""
    model = MODELS[kind]()
    ids, mask, _ = padded_batch()
    clean = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    zero_bwd = lambda h, n: torch.cat([h[..., :8], torch.zeros_like(h[..., 8:])], -1)  # noqa: E731
    with model.hooks([("blocks.0.resid_post", zero_bwd)]):
        edited = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert torch.equal(edited[1][..., 8:], torch.zeros_like(edited[1][..., 8:]))
    assert torch.equal(edited[2][..., :8], clean[2][..., :8])  # the forward stream did not read it
    assert not torch.allclose(edited[2][..., 8:], clean[2][..., 8:])


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_the_loss_is_the_mean_of_the_two_directions_nll_by_hand(kind):
    model = MODELS[kind]()
    ids, mask, lengths = padded_batch()
    h = model(ids, attention_mask=mask).last_hidden_state  # eval: no dropout
    W, bias = model.softmax.weight, model.softmax.bias
    fwd, bwd = [], []
    for b, n in enumerate(lengths.tolist()):
        for t in range(n - 1):  # forward: the state at t predicts token t+1
            fwd.append(-torch.log_softmax(W @ h[b, t, :8] + bias, -1)[ids[b, t + 1]])
        for t in range(1, n):  # backward: the state at t predicts token t-1
            bwd.append(-torch.log_softmax(W @ h[b, t, 8:] + bias, -1)[ids[b, t - 1]])
    f, bw = torch.stack(fwd).mean(), torch.stack(bwd).mean()
    out = bilm_loss(model, ids, mask)
    assert out.n == len(fwd) == len(bwd) == 8 + 4 + 1
    torch.testing.assert_close(out.forward, f)
    torch.testing.assert_close(out.backward, bw)
    torch.testing.assert_close(out.loss, (f + bw) / 2)
    fused = bilm_loss(model, ids, mask, cross_entropy=linear_cross_entropy)  # the training kernel
    torch.testing.assert_close(fused.loss, out.loss)
    logits = model(ids, attention_mask=mask, return_logits=True)
    torch.testing.assert_close(logits.logits[0, 0], W @ h[0, 0, :8] + bias)
    torch.testing.assert_close(logits.backward_logits[0, 3], W @ h[0, 3, 8:] + bias)


def test_attentions_head_masks_and_left_padding_are_refused():
    model = tiny()
    ids, mask, _ = padded_batch()
    with pytest.raises(ValueError, match="ElmoBiLM has no attention heads"):
        model(ids, attention_mask=mask, output_attentions=True)
    with pytest.raises(ValueError, match="ElmoBiLM has no attention heads"):
        model(ids, head_mask=torch.ones(2, 1))
    with pytest.raises(ValueError, match="right padding"):
        model(ids, attention_mask=mask.flip(1))
    with pytest.raises(ValueError, match="d_proj"):
        ElmoConfig(**{**TINY, "d_proj": 32})


def test_the_transformer_control_head_mask_gates_each_direction_and_michel_finds_a_dead_head():
    """Head mask order: each layer's forward heads, then its backward heads. Gating a forward head
    leaves the backward half of every layer unchanged, and the reverse; a backward head whose output
    projection is zero scores exactly 0 in Michel's importance on the biLM loss, and only it."""
    model = tiny_t()
    ids, mask, _ = padded_batch()
    L, H = model.config.n_layers, model.config.n_heads
    P = model.config.d_proj
    with torch.no_grad():
        full = model(ids, attention_mask=mask, output_hidden_states=True, attn_impl="eager").hidden_states
        for head, kept in ((0, slice(P, None)), (H // 2, slice(None, P))):
            gate = torch.ones(L, H)
            gate[0, head] = 0.0
            out = model(ids, attention_mask=mask, head_mask=gate, output_hidden_states=True).hidden_states
            real = mask.bool()
            assert torch.equal(out[L][..., kept][real], full[L][..., kept][real])
            changed = slice(None, P) if kept.start == P else slice(P, None)
            assert (out[L][..., changed][real] - full[L][..., changed][real]).abs().max() > 1e-6
        Dh = P // (H // 2)
        model.blocks[1].bwd_block.attn.out.weight[:, :Dh] = 0.0  # layer 1, backward head 0 = mask index H / 2
    with pytest.raises(ValueError, match="head_mask must be"):
        model(ids, head_mask=torch.ones(L, H // 2))
    scores = michel_importance(model, [{"input_ids": ids, "attention_mask": mask}], bilm_stat)
    assert scores.shape == (L, H) and scores[1, H // 2] == 0.0
    assert (np.delete(scores.ravel(), H + H // 2) > 0).all()


def test_the_transformer_control_attends_to_its_own_side_in_reading_order():
    model = tiny_t()
    ids, mask, lengths = padded_batch()
    out = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert model.n_heads_per_layer == [2, 2] and model.config.n_heads == 2 and model.config.d_model == 16
    assert len(out.attentions) == 2 and all(a.shape == (3, 2, 9, 9) for a in out.attentions)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    for a in out.attentions:
        fwd, bwd = a[:, 0], a[:, 1]  # head 0: the forward LM's, head 1: the backward LM's
        for b, n in enumerate(lengths.tolist()):
            real = (i < n) & (j < n)
            assert torch.all(fwd[b][(j > i) & (i < n)] == 0) and torch.all(bwd[b][((j < i) | (j >= n)) & (i < n)] == 0)
            torch.testing.assert_close(fwd[b][real].view(n, n).sum(-1), torch.ones(n))
            torch.testing.assert_close(bwd[b][real].view(n, n).sum(-1), torch.ones(n))
    fast = model(ids, attention_mask=mask, output_hidden_states=True, attn_impl="sdpa").hidden_states
    for h_eager, h_fast, in zip(out.hidden_states, fast):  # eager and SDPA paths agree at real tokens
        torch.testing.assert_close(h_eager[mask.bool()], h_fast[mask.bool()], atol=1e-5, rtol=1e-5)
    # layer 0: the shared token embedding plus each direction's own position (the backward LM counts
    # from the row's end)
    e, pos = model.wte(ids[1, :5]), model.wpe.weight
    torch.testing.assert_close(out.hidden_states[0][1, :5], torch.cat([e + pos[:5], e + pos[:5].flip(0)], -1))


def test_the_kind_picks_the_objective():
    base = dict(train_source="x", preset="tiny")
    assert PretrainConfig.from_dict({**base, "kind": "bilm"}).objective == "auto"
    with pytest.raises(ValueError, match="trains an bilm"):
        PretrainConfig.from_dict({**base, "kind": "encoder", "objective": "bilm"})
    with pytest.raises(ValueError, match="trains an encoder"):
        PretrainConfig.from_dict({**base, "kind": "bilm", "objective": "mlm"})
    assert PretrainConfig.from_dict({**base, "kind": "tbilm", "objective": "tbilm"}).kind == "tbilm"


@pytest.fixture(scope="module", params=["bilm", "tbilm"])
def trained(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    data = toy_corpus(d / "train.txt", 2000, 0), toy_corpus(d / "valid.txt", 200, 1)
    tok = fixed_wordpiece(data[0], d / "tok")
    cfg = toy_config(data, kind=request.param, max_steps=12, tokenizer_path=str(tok), eval_sequences=16,
               lr=1e-2 if request.param == "bilm" else 3e-3, warmup_steps=2)
    return cfg, run_training(cfg, d / "run"), d


def test_bilm_trains_saves_loads_and_resumes_bit_exact(trained, tmp_path):
    cfg, result, d = trained
    kind = cfg.kind
    rows = [json.loads(r) for r in (d / "run" / "metrics.jsonl").read_text().splitlines()]
    ev = {(r["step"], r["metric"]): r["value"] for r in rows if r["split"] == "eval"}
    assert ev[(12, "loss")] < ev[(0, "loss")] - 1.0 and ev[(12, "loss")] < ev[(12, "unigram_loss")]
    assert abs(ev[(12, "loss")] - (ev[(12, "fwd_loss")] + ev[(12, "bwd_loss")]) / 2) < 1e-9
    train = [r for r in rows if r["split"] == "train"]
    assert {"fwd_loss", "bwd_loss"} <= {r["metric"] for r in train}
    card = json.loads((result.path / "card.json").read_text())
    assert card["objective_name"] == kind and card["kind"] == kind
    assert card["n_heads_per_layer"] == ([0, 0] if kind == "bilm" else [2, 2])
    model, tok = load(result.path)
    assert isinstance(model, ElmoBiLM if kind == "bilm" else TransformerBiLM) and tok is not None
    assert model.config == result.model.config
    ids, mask, _ = padded_batch()
    ids = ids % model.config.vocab_size
    result.model.eval()
    a = result.model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    b = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    killed = run_training(cfg, tmp_path / "b", stop_at_step=8)  # last checkpoint: step 8
    assert killed.path is None
    resumed = run_training(cfg, tmp_path / "b")
    wa, wb = result.model.state_dict(), resumed.model.state_dict()
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_extraction_writes_l_plus_1_layers_of_2_d_proj(trained, tmp_path):
    _, result, _ = trained
    kind = result.model.kind  # word-level attention too, for the model that has heads
    assert_store_is_the_hidden_states(result.path, tmp_path / "store", kind, attentions=kind == "tbilm")
    assert result.model.config.d_model == 2 * result.model.config.d_proj


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_sentence_classifier_reads_each_direction_after_the_whole_sentence(kind):
    model = MODELS[kind]()
    ids, mask, lengths = padded_batch()
    clf = Classifier(model, 2, "sentence").eval()
    feats = clf.features(ids, mask)
    h = model(ids, attention_mask=mask).last_hidden_state
    assert feats.shape == (3, 16)
    torch.testing.assert_close(feats[1], torch.cat([h[1, 4, :8], h[1, 0, 8:]]))
    alone = clf.features(ids[1:2, :5], mask[1:2, :5])
    torch.testing.assert_close(feats[1], alone[0], atol=1e-5, rtol=1e-5)


def test_the_analyses_read_a_bilm_or_refuse_it_by_name(trained, tmp_path):
    """Amnesic probing's LM loss is the biLM loss (the mean of the two directions); the transformer
    biLM's heads are pruned on it; head gating and pruning refuse ELMo (no head mask), head analysis
    a model without heads, naming the kind."""
    _, result, _ = trained
    model, tok = load(result.path)
    model.eval()
    sents = [["the", "cat", "sees", "the", "river", "."], ["two", "dogs", "call", "."]]
    data = held_out(model, tok, sents, AmnesicRunConfig(batch_size=2))
    loss, vecs = run_model(model, data, layers=[0, model.config.n_layers])
    batch = data.batches[0]
    with torch.no_grad():
        ref = bilm_loss(model, batch["ids"], batch["mask"]).loss
    assert loss == pytest.approx(float(ref), rel=1e-5)
    assert vecs[0].shape == (10, model.config.d_model)
    em = emergence_cli(result.path.parent, tmp_path / "emergence",
                       config={"tasks": [], "lm": False, "head_sentences": 10})["emergence"]
    assert ("heads" in set(em["task_or_score"])) == (model.kind == "tbilm")  # ELMo's LSTMs: no head rows
    if model.kind == "tbilm":  # heads: pruning curves on the biLM loss, gating with the biLM loss rows
        cfg = {"eval_data": "ewt", "n_sequences": 6, "batch_size": 3, "fractions": [0.0, 1.0], "random_seeds": [0],
               "tolerances": [], "l0_lambdas": []}
        tables = prune_model_cli(result.path, ["michel", "confidence", "random"], tmp_path / "prune", cfg,
                                 progress=False)
        assert set(tables["pruning"]["metric"]) == {"bilm_loss"} and tables["pruned_speed"].empty
        assert len(tables["importance"]) == 2 * model.config.n_layers * model.config.n_heads
        gated = gate_model(result.path, out_dir=tmp_path / "gate", progress=False,
                           config={"tasks": ["pos"], "units": ["head"], "max_train_targets": 200, "lm_sentences": 8,
                                   "random_draws": 0})["gating"]
        delta = gated[(gated["metric"] == "lm_loss_delta") & (gated["unit"] == "head")]["value"]
        assert len(delta) == model.config.n_layers * model.config.n_heads and (delta.abs() > 0).all()
        return
    with pytest.raises(ValueError, match=f"a {model.kind} model has no head mask"):
        gate_model(result.path, out_dir=tmp_path / "gate", progress=False)
    with pytest.raises(ValueError, match=f"a {model.kind} model has no head mask"):
        prune_model_cli(result.path, out_dir=tmp_path / "prune", progress=False)
    if model.kind == "bilm":
        with pytest.raises(ValueError, match="a bilm model has no attention heads"):
            analyse_heads(result.path, out_dir=tmp_path / "heads", progress=False)
