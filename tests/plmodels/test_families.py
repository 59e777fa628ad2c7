"""The family registry (plmodels/families.py): one record per kind, and what each record promises.

Each check compares a record's function with the model computed by hand (the LM statistics, the
held-out logits, the sentence features, the head grid) or with the other registries it must agree
with (checkpoint's MODEL_KINDS, the trainer's objectives and its config's kinds)."""
from __future__ import annotations

import typing

import pytest
import torch
import torch.nn.functional as F

from plmodels.checkpoint import MODEL_KINDS, build_model
from plmodels.elmo import bilm_loss
from plmodels.families import FAMILIES, KINDS, AnalysedModel, family, family_of, preset
from plmodels.training.config import AUTO_OBJECTIVE, OBJECTIVE_FIELDS, PretrainConfig
from plmodels.training.objectives import OBJECTIVES

from .tiny import batch, tiny_decoder, tiny_encoder

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(kind: str):
    torch.manual_seed(0)
    return build_model(kind, {**preset(kind, "tiny"), "vocab_size": 61}).eval()


def test_the_other_tables_are_read_off_the_records():
    assert set(MODEL_KINDS) == set(FAMILIES) and KINDS == tuple(FAMILIES)
    assert all(MODEL_KINDS[k] == (f.model_class, f.config_class) for k, f in FAMILIES.items())
    assert typing.get_args(typing.get_type_hints(PretrainConfig)["kind"]) == KINDS
    objectives = typing.get_args(typing.get_type_hints(PretrainConfig)["objective"])   # and the objectives'
    assert objectives == ("auto", *OBJECTIVE_FIELDS) and set(OBJECTIVE_FIELDS) == set(OBJECTIVES)
    assert AUTO_OBJECTIVE == {k: f.default_objective for k, f in FAMILIES.items()}
    for kind, f in FAMILIES.items():  # a default objective trains that kind (the objectives' own table)
        assert f.default_objective is None or (f.default_objective in OBJECTIVES
                                               and OBJECTIVE_FIELDS[f.default_objective][0] == kind)


@pytest.mark.parametrize("kind", KINDS)
def test_each_record_builds_an_analysed_model_of_its_kind(kind):
    model = tiny(kind)
    assert isinstance(model, FAMILIES[kind].model_class) and isinstance(model, AnalysedModel)
    assert family_of(model) is FAMILIES[kind] and model.kind == kind
    grid = FAMILIES[kind].heads_per_layer(model)
    assert len(grid) == (model.config.n_layers + 2 * model.config.n_decoder_layers if kind == "seq2seq"
                         else model.config.n_layers)
    assert set(grid) == ({0} if not FAMILIES[kind].head_mask else {model.config.n_heads})


def test_unknown_kinds_are_one_clear_error():
    with pytest.raises(ValueError, match=r"unknown model kind 'lstm'; known: \['bilm', 'decoder'"):
        family("lstm")
    with pytest.raises(ValueError, match="Linear has no `kind`"):
        family_of(torch.nn.Linear(2, 2))


def test_masked_lm_stat_is_the_cross_entropy_at_the_masked_positions_under_the_head_mask():
    model = tiny_encoder()
    ids, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 2], labels[0, 4] = ids[:, 2], ids[0, 4]  # 4 predicted tokens
    masked = ids.clone()
    masked[labels != -100] = 3
    head_mask = torch.ones(2, 4)
    head_mask[1, 2] = 0.0
    stat = FAMILIES["encoder"].lm_stat
    total, n = stat(model, {"input_ids": masked, "attention_mask": mask, "labels": labels}, head_mask)
    h = model(masked, attention_mask=mask, head_mask=head_mask).last_hidden_state
    want = F.cross_entropy(model.mlm_logits(h[labels != -100]), labels[labels != -100], reduction="sum")
    assert int(n) == 4
    torch.testing.assert_close(total, want, atol=0, rtol=0)
    unmasked, _ = stat(model, {"input_ids": masked, "attention_mask": mask, "labels": labels}, None)
    assert (unmasked - total).abs() > 1e-4  # the head mask reaches the forward


def test_causal_lm_stat_is_the_next_token_loss_over_real_tokens():
    model = tiny_decoder()
    ids, mask = batch()  # the last row is padded from position 6
    total, n = FAMILIES["decoder"].lm_stat(model, {"input_ids": ids, "attention_mask": mask}, None)
    logits = model(ids, attention_mask=mask).logits
    want = sum(F.cross_entropy(logits[b, : int(mask[b].sum()) - 1], ids[b, 1: int(mask[b].sum())], reduction="sum")
               for b in range(len(ids)))
    assert int(n) == int(mask[:, 1:].sum()) == 2 * 8 + 5
    torch.testing.assert_close(total, want, atol=1e-4, rtol=1e-5)


def test_bilm_stat_is_the_mean_of_both_directions_summed_over_predictions():
    model = tiny("tbilm")
    ids, mask = batch()
    total, n = FAMILIES["tbilm"].lm_stat(model, {"input_ids": ids, "attention_mask": mask}, None)
    r = bilm_loss(model, ids, mask)  # the model file's own loss, the reference
    assert int(n) == r.n == int(mask.sum()) - len(ids)  # each direction predicts all but one token a row
    torch.testing.assert_close(total / n, r.loss)


def test_the_held_out_logits_are_the_full_forwards_at_the_targets():
    """Family.lm_logits (the evaluator's fast path: an encoder's last block at the targets only) equals
    the logits of a plain forward at the same positions."""
    class Rows:  # the evaluator's Batch: input_ids and extras
        def __init__(self, ids):
            self.input_ids, self.extras = ids, {}

    ids, _ = batch(pad_from=None)
    select = torch.zeros_like(ids, dtype=torch.bool)
    select[:, 3] = select[1, 5] = True
    enc, dec = tiny_encoder(), tiny_decoder()
    with torch.no_grad():
        got = FAMILIES["encoder"].lm_logits(enc, Rows(ids), select)
        torch.testing.assert_close(got, enc.mlm_logits(enc(ids).last_hidden_state[select]), atol=1e-5, rtol=1e-5)
        got = FAMILIES["decoder"].lm_logits(dec, Rows(ids), select)
        torch.testing.assert_close(got, dec(ids).logits[select], atol=1e-5, rtol=1e-5)
    assert FAMILIES["bilm"].lm_logits is None and FAMILIES["seq2seq"].lm_logits is None  # their own evaluators


def test_sentence_features_pooled_last_token_and_both_directions():
    ids, mask = batch()  # row 2 has 6 real tokens
    enc, dec, bi = tiny_encoder(), tiny_decoder(), tiny("bilm")
    with torch.no_grad():
        out = enc(ids, attention_mask=mask)
        assert torch.equal(family_of(enc).sentence_features(enc, out, mask), out.pooler_output)
        out = dec(ids, attention_mask=mask)
        feats = family_of(dec).sentence_features(dec, out, mask)
        assert torch.equal(feats[2], out.last_hidden_state[2, 5]) and torch.equal(feats[0], out.last_hidden_state[0, 8])
        out = bi(ids, attention_mask=mask)
        feats = family_of(bi).sentence_features(bi, out, mask)
        P = bi.config.d_proj
        assert torch.equal(feats[2], torch.cat([out.last_hidden_state[2, 5, :P], out.last_hidden_state[2, 0, P:]]))
    assert [FAMILIES[k].summary_token for k in ("encoder", "decoder")] == ["first", "last"]


def test_a_seq2seq_batch_forward_splits_its_head_mask_over_the_three_attentions():
    model = tiny("seq2seq")
    ids, mask = batch(pad_from=None)
    dec = model.shift_right(ids[:, :5])
    rows = FAMILIES["seq2seq"].heads_per_layer(model)
    head_mask = torch.ones(len(rows), rows[0])
    head_mask[-1, 0] = 0.0  # the last row: the decoder's last cross-attention layer
    b = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec}
    with torch.no_grad():
        got = FAMILIES["seq2seq"].forward_batch(model, b, head_mask).logits
        want = model(ids, attention_mask=mask, decoder_input_ids=dec, **model.split_head_mask(head_mask)).logits
        plain = FAMILIES["seq2seq"].forward_batch(model, b).logits
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert (got - plain).abs().max() > 1e-6
    with pytest.raises(ValueError, match="decoder_input_ids"):
        FAMILIES["seq2seq"].forward_batch(model, {"input_ids": ids})
