"""T5 and BART (plmodels/seq2seq.py) train like every other kind: objectives "t5" and "bart"
(objectives.py) make their batches from the packed rows (data.t5_batch / bart_batch), lower the
held-out loss through `run_training`, save a "seq2seq" checkpoint that loads to the same outputs,
resume bit-exact, and let the workbench's extraction read the encoder's L + 1 layers."""
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from plmodels.checkpoint import load, n_parameters
from plmodels.encoder import Encoder, EncoderConfig
from plmodels.families import preset
from plmodels.seq2seq import Seq2Seq, Seq2SeqConfig
from plmodels.training import PretrainConfig, load_config
from plmodels.training.config import BartArgs, T5Args
from plmodels.training.data import bart_batch, sentinel_ids, t5_batch, with_sentinels
from plmodels.training.loop import run_training
from plmodels.training.masking import continuation_ids, step_generator, word_starts
from plmodels.training.objectives import seq2seq_loss
from tests.plmodels.kinds import (assert_same_weights, assert_store_is_the_hidden_states, packed_rows,
                                  same_loss_and_grads)
from tests.plmodels.toy_runs import fixed_wordpiece, toy_config, toy_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

RECIPE_MODEL = {fam: load_config(f"{fam}-tiny").model for fam in ("t5", "bart")}  # the recipes' family options
ARGS = {"t5": {"n_sentinels": 16}, "bart": {}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("s2s")
    data = toy_corpus(d / "train.txt", 2000, 0), toy_corpus(d / "valid.txt", 200, 1)
    return data, fixed_wordpiece(data[0], d / "tok")


def _run_cfg(corpus, fam, **kw):
    data, tok = corpus
    run = dict(model={**RECIPE_MODEL[fam], "dropout": 0.0}, max_steps=30, eval_sequences=16, lr=3e-3, warmup_steps=2)
    return toy_config(data, kind="seq2seq", objective=fam, objective_args=ARGS[fam], tokenizer_path=str(tok), **{**run, **kw})


@pytest.fixture(scope="module", params=["t5", "bart"])
def trained(request, corpus, tmp_path_factory):
    cfg = _run_cfg(corpus, request.param)
    out = tmp_path_factory.mktemp(request.param) / "run"
    return cfg, run_training(cfg, out), out


def _rows(tok_dir, n=4, seq_len=24, seed=0):
    return packed_rows(tok_dir, n, seq_len, seed)


def test_a_trained_run_lowers_the_heldout_loss_and_loads_to_the_same_outputs(trained):
    cfg, result, out = trained
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    ev = {(r["step"], r["metric"]): r["value"] for r in rows if r["split"] == "eval"}
    assert ev[(30, "loss")] < ev[(0, "loss")] - 1.0, ev
    assert ev[(30, "loss")] < ev[(30, "unigram_loss")] - 0.5, ev
    assert ev[(30, "noise_loss")] < ev[(0, "noise_loss")] - 1.0, ev  # the tokens the encoder did not see, too
    card = json.loads((result.path / "card.json").read_text())
    assert card["kind"] == "seq2seq" and card["objective_name"] == cfg.objective
    assert ("span corruption" if cfg.objective == "t5" else "text infilling") in card["objective"]
    assert card["n_heads_per_layer"] == [2, 2]
    model, tok = load(result.path)
    assert isinstance(model, Seq2Seq) and model.config == result.model.config
    pad, sep = tok.pad_id, tok.sep_id
    assert model.config.decoder_start_token_id == (pad if cfg.objective == "t5" else sep)
    if cfg.objective == "t5":  # the tokenizer saved with the checkpoint carries the sentinels at the top
        assert sentinel_ids(tok, 16) == list(range(tok.vocab_size - 1, tok.vocab_size - 17, -1))
        assert model.config.vocab_size == tok.vocab_size
    ids = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    dec = model.shift_right(ids)
    result.model.eval()
    a, b = result.model(ids, decoder_input_ids=dec), model(ids, decoder_input_ids=dec)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.encoder_last_hidden_state, b.encoder_last_hidden_state)


def test_a_killed_t5_run_resumes_to_bit_identical_weights(corpus, tmp_path):
    """One family is enough: T5's, whose tokenizer gains the sentinels (dropout on: its RNG replays too)."""
    cfg = _run_cfg(corpus, "t5", model={**RECIPE_MODEL["t5"], "dropout": 0.1}, eval_every=4)
    result = run_training(cfg, tmp_path / "a")
    killed = run_training(cfg, tmp_path / "b", stop_at_step=8)  # last checkpoint: step 8 (log-spaced)
    assert killed.path is None
    resumed = run_training(cfg, tmp_path / "b")
    assert_same_weights(result.model.state_dict(), resumed.model.state_dict())


def test_a_t5_batch_rebuilds_the_original_row(corpus):
    tok, rows = _rows(corpus[1])
    tok = with_sentinels(tok, 16)
    assert with_sentinels(tok, 16) is tok  # idempotent (a resumed run, a T5 tokenizer)
    sent = sentinel_ids(tok, 16)
    assert sent[0] == tok.vocab_size - 1 and sent[15] == tok.vocab_size - 16  # T5's extra ids count down
    b = t5_batch(rows, tok, T5Args(n_sentinels=16), step_generator(0, 0), "cpu")
    assert b.extras["attention_mask"] is None  # rows of one length corrupt to one length
    assert torch.equal(b.extras["decoder_input_ids"][:, 0], torch.full((4,), tok.pad_id))  # T5 starts from pad
    assert torch.equal(b.extras["decoder_input_ids"][:, 1:], b.labels[:, :-1])
    index = {s: i for i, s in enumerate(sent)}
    for row, inp, tgt in zip(rows.tolist(), b.input_ids.tolist(), b.labels.tolist()):
        assert inp[0] == tok.cls_id and inp[-1] == tgt[-1] == tok.sep_id  # [CLS] ... EOS, ... EOS
        spans, k = {}, None  # target: <extra_id_k> span k ...
        for t in tgt[:-1]:
            if t in index:
                k = index[t]
                spans[k] = []
            else:
                spans[k].append(t)
        body = [t for x in inp[1:-1] for t in (spans[index[x]] if x in index else [x])]
        assert [tok.cls_id] + body + [tok.sep_id] == row
        n_noise = sum(len(s) for s in spans.values())
        assert n_noise == round(22 * 0.15) and len(spans) == 1  # 3 noise tokens in round(3 / 3) span


def test_a_bart_batch_targets_the_row_and_shifts_it_right(corpus):
    tok, rows = _rows(corpus[1], n=6, seq_len=40)
    cont = continuation_ids(tok.hf.get_vocab())
    b = bart_batch(rows, tok, BartArgs(), step_generator(0, 1), cont, "cpu")
    assert torch.equal(b.labels, rows)
    assert torch.equal(b.extras["decoder_input_ids"], torch.cat([torch.full((6, 1), tok.sep_id), rows[:, :-1]], 1))
    mask = b.extras["attention_mask"]
    mask = torch.ones_like(b.input_ids) if mask is None else mask
    starts = word_starts(rows, cont)
    for row, inp, m, scored, st in zip(rows, b.input_ids, mask, b.extras["scored"], starts):
        inp = inp[m.bool()]
        assert inp[0] == tok.cls_id and inp[-1] == tok.sep_id and (inp == tok.mask_id).any()
        assert len(inp) < len(row)  # spans became one token each
        words = int(st[1:-1].sum())  # the budget counts whole words strictly inside the row
        assert not scored[0] and not scored[-1] and 0 < int((scored & st).sum()) <= math.ceil(0.3 * words)
        assert not (scored[1:] & ~st[1:] & ~scored[:-1]).any()  # whole words: no span starts inside a word
        assert not (scored[:-1] & ~st[1:] & ~scored[1:]).any()  # ... nor stops inside one


@pytest.mark.parametrize("fam", ["t5", "bart"])
def test_the_loss_over_every_decoder_position_is_the_targets_cross_entropy(corpus, fam):
    # seq2seq_loss feeds every decoder position to the fused loss, -100 weighing nothing: its loss and
    # one step's gradients equal cross-entropy of the logits at the targets picked out by a mask
    # (what it computed before issue 81), fp32, 1e-6; three of the last row's targets are ignored
    tok, rows = _rows(corpus[1])
    tok = with_sentinels(tok, 16) if fam == "t5" else tok
    gen = step_generator(0, 3)
    if fam == "t5":
        b = t5_batch(rows, tok, T5Args(n_sentinels=16), gen, "cpu")
    else:
        b = bart_batch(rows, tok, BartArgs(), gen, continuation_ids(tok.hf.get_vocab()), "cpu")
    b.labels[-1, -3:] = -100
    start = b.extras["decoder_start"]
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(**{**preset("seq2seq", "tiny"), **RECIPE_MODEL[fam], "dropout": 0.0,
                                     "vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id,
                                     "decoder_start_token_id": start}))
    params = list(model.parameters())
    loss, n, parts = seq2seq_loss(model, b, autocast=False)
    got = torch.autograd.grad(loss, params, allow_unused=True)
    sel = b.labels != -100
    logits = model(b.input_ids, attention_mask=b.extras["attention_mask"],
                   decoder_input_ids=b.extras["decoder_input_ids"]).logits
    ref = F.cross_entropy(logits[sel], b.labels[sel])
    want = torch.autograd.grad(ref, params, allow_unused=True)
    assert int(n) == int(sel.sum()) == b.labels.numel() - 3 and parts == {}
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    for (name, _), g, w in zip(model.named_parameters(), got, want):
        assert (g is None) == (w is None), name
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=name)
    # the start id the batch was built with is checked on the host, before any work
    model.config = dataclasses.replace(model.config, decoder_start_token_id=start + 1)
    with pytest.raises(ValueError, match=f"decoder inputs start from {start}, the model's decoder_start_token_id "
                                         f"is {start + 1}"):
        seq2seq_loss(model, b, autocast=False)


def _bart_model(tok) -> Seq2Seq:
    torch.manual_seed(0)
    return Seq2Seq(Seq2SeqConfig(**{**preset("seq2seq", "tiny"), **RECIPE_MODEL["bart"], "dropout": 0.0,
                                    "vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id,
                                    "decoder_start_token_id": tok.sep_id}))


def test_a_static_length_bart_batch_gives_the_loss_and_gradients_of_the_unpadded_one(corpus):
    # a compiled run pads the noised encoder input to the row length L (static shapes, issue 81):
    # the same draws, [PAD] past each row's end under the attention mask, the same (B, L) decoder
    # side, and the loss and one step's gradients of the batch padded to its longest row (fp32, 1e-6)
    tok, rows = _rows(corpus[1])
    cont = continuation_ids(tok.hf.get_vocab())
    own = bart_batch(rows, tok, BartArgs(), step_generator(0, 3), cont, "cpu")
    fixed = bart_batch(rows, tok, BartArgs(), step_generator(0, 3), cont, "cpu", length=24)
    te = own.input_ids.shape[1]
    assert te < 24 and fixed.input_ids.shape == (4, 24)  # infilling shortened every row: padding to add
    own_mask = own.extras["attention_mask"]
    own_mask = torch.ones_like(own.input_ids) if own_mask is None else own_mask
    mask = fixed.extras["attention_mask"]
    assert torch.equal(fixed.input_ids[:, :te], own.input_ids) and bool((fixed.input_ids[:, te:] == tok.pad_id).all())
    assert torch.equal(mask[:, :te], own_mask) and not bool(mask[:, te:].any())
    for k in ("decoder_input_ids", "scored"):
        assert torch.equal(fixed.extras[k], own.extras[k]), k
    assert torch.equal(fixed.labels, own.labels) and fixed.labels.shape == (4, 24)
    model = _bart_model(tok)
    assert same_loss_and_grads(model, seq2seq_loss, own, fixed) == 4 * 24


def test_a_static_length_bart_batch_cuts_a_row_that_insertions_made_longer(corpus):
    # lambda 0.05: nearly every span has length 0 and becomes an inserted [MASK] or random token, so
    # the noised rows outgrow L; with `length` such a row keeps its first L - 1 tokens and its [SEP]
    tok, rows = _rows(corpus[1])
    cont = continuation_ids(tok.hf.get_vocab())
    args = BartArgs(poisson_lambda=0.05)
    own = bart_batch(rows, tok, args, step_generator(0, 5), cont, "cpu")
    fixed = bart_batch(rows, tok, args, step_generator(0, 5), cont, "cpu", length=24)
    own_mask = own.extras["attention_mask"]
    own_mask = torch.ones_like(own.input_ids) if own_mask is None else own_mask
    lengths = own_mask.sum(1)
    assert fixed.input_ids.shape == (4, 24) and int(lengths.max()) > 24
    for x, n, y, m in zip(own.input_ids, lengths, fixed.input_ids, fixed.extras["attention_mask"]):
        x = x[:n]
        want = torch.cat([x[:23], x[-1:]]) if n > 24 else x
        assert want[-1] == tok.sep_id and torch.equal(y[: len(want)], want) and int(m.sum()) == len(want)
    assert torch.equal(fixed.labels, rows)


def test_t5_batches_of_a_row_length_have_one_shape_whatever_the_draws(corpus):
    # T5's span corruption draws where the spans go, never how many tokens: N = round(n density) noise
    # tokens in round(N / mean) spans, so its encoder and decoder lengths depend on the row length
    # alone, and a compiled T5 step has static shapes without padding
    tok, rows = _rows(corpus[1])
    tok = with_sentinels(tok, 16)
    shapes = {(tuple(b.input_ids.shape), tuple(b.labels.shape), b.extras["attention_mask"] is None)
              for b in (t5_batch(rows, tok, T5Args(n_sentinels=16), step_generator(0, i), "cpu") for i in range(8))}
    # 22 tokens inside [CLS] ... [SEP]: 3 noise tokens in 1 span; [CLS], 19 kept, a sentinel, [SEP]
    assert shapes == {((4, 1 + 19 + 1 + 1), (4, 1 + 3 + 1), True)}


def test_the_encoder_alone_answers_the_workbench_call():
    torch.manual_seed(0)
    model = Seq2Seq(Seq2SeqConfig(vocab_size=61, d_model=16, n_layers=2, n_decoder_layers=1, n_heads=2, d_ff=32,
                                  max_positions=16, dropout=0.0)).eval()
    ids = torch.randint(5, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    full = model(ids, attention_mask=mask, decoder_input_ids=model.shift_right(ids), output_hidden_states=True,
                 output_attentions=True)
    enc = model(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True, attn_impl="eager",
                unpad=True)
    assert model.n_heads_per_layer == [2, 2] and len(enc.hidden_states) == 3 and len(enc.attentions) == 2
    real = mask.bool()
    torch.testing.assert_close(enc.last_hidden_state[real], full.encoder_last_hidden_state[real])
    assert torch.all(enc.last_hidden_state[~real] == 0)  # unpad: zero at the padding
    for h, g in zip(enc.hidden_states, full.encoder_hidden_states):
        torch.testing.assert_close(h[real], g[real])
    for a, g in zip(enc.attentions, full.encoder_attentions):
        torch.testing.assert_close(a, g)
    with pytest.raises(ValueError, match="without decoder_input_ids"):
        model(ids, decoder_head_mask=torch.ones(1, 2))


def test_extraction_writes_the_encoders_l_plus_1_layers(trained, tmp_path):
    assert_store_is_the_hidden_states(trained[1].path, tmp_path / "store", "seq2seq", attentions=True)


def test_objective_args_and_the_auto_objective_are_checked():
    base = dict(kind="seq2seq", train_source="x", preset="tiny")
    with pytest.raises(ValueError, match="noise_densty"):
        PretrainConfig.from_dict({**base, "objective": "t5", "objective_args": {"noise_densty": 0.2}})
    with pytest.raises(ValueError, match="mask_ration"):
        PretrainConfig.from_dict({**base, "objective": "bart", "objective_args": {"mask_ration": 0.2}})
    with pytest.raises(ValueError, match="noise_density must be in"):
        PretrainConfig.from_dict({**base, "objective": "t5", "objective_args": {"noise_density": 1.5}})
    with pytest.raises(ValueError, match="'t5'.*'bart'"):
        PretrainConfig.from_dict(base)
    with pytest.raises(ValueError, match="trains an encoder"):
        PretrainConfig.from_dict({**base, "objective": "mlm"})
    with pytest.raises(ValueError, match="trains an seq2seq"):
        PretrainConfig.from_dict({**base, "kind": "encoder", "objective": "bart"})


def test_the_recipes_and_the_mini_shape_match_bert_mini():
    t5, bart = load_config("t5-mini"), load_config("bart-mini")
    assert (t5.objective, bart.objective) == ("t5", "bart") and t5.objective_args["n_sentinels"] == 100
    assert t5.model["position"] == "relative" and bart.model["position"] == "learned" and bart.model["norm"] == "post"
    shape = preset("seq2seq", "mini")
    assert (shape["n_layers"], shape["n_decoder_layers"], shape["d_model"], shape["d_ff"]) == (2, 2, 256, 1024)
    bert = n_parameters(Encoder(EncoderConfig(**preset("encoder", "mini"), vocab_size=16000)))
    ours = n_parameters(Seq2Seq(Seq2SeqConfig(**{**shape, **t5.model}, vocab_size=16100)))
    assert abs(ours / bert - 1) < 0.1, (ours, bert)
